"""`python -m dpuoffload.dpu [training flags]` — app context 1 of the MPMD job (dpurun starts it)."""

from dpuoffload.common.runtime.malloc import pause_collector

pause_collector()  # (until the end of start-up, before the imports below: common/runtime/malloc.py)

from dpuoffload.common.runtime.fastexit import run_and_exit_fast  # noqa: E402 (after the pause)
from dpuoffload.dpu.main import run  # noqa: E402

if __name__ == "__main__":
    run_and_exit_fast(run)  # skips the ~1.5 s teardown of torch's modules (common/runtime/fastexit.py)
