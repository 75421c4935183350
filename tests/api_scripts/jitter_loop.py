"""A user script whose training set has a float ColorJitter (tests/jobs/test_numerics_jobs.py runs it under
dpurun with a DPU rank on other CPU kernels): the numerics check runs on `job.loader`'s first batch."""

from __future__ import annotations

import dpuoffload as dpu
from tests.user_factories import photos_jitter

job = dpu.init()
loader = job.loader(photos_jitter(None, True, False), batch_size=8, epochs=1)
print(f"script: {sum(1 for _ in loader.epoch(0))} batches", flush=True)
job.finish()
