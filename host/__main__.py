"""`python -m dpuoffload.host [training flags]` — app context 0 of the MPMD job (dpurun starts it)."""

from dpuoffload.common.runtime.fastexit import run_and_exit_fast
from dpuoffload.host.main import run

if __name__ == "__main__":
    run_and_exit_fast(run)  # skips the ~1.5 s teardown of torch's modules (common/runtime/fastexit.py)
