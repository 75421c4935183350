"""A script started with clone ranks that neither hands the state off nor restores it
(tests/jobs/test_api_jobs.py): both mistakes must end the job in one line each, not leave the clones waiting."""

import dpuoffload as dpu

job = dpu.init()  # finished by the exit hook
