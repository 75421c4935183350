"""`python -m dpuoffload.dpu [training flags]` — app context 1 of the MPMD job (dpurun starts it)."""

from dpuoffload.dpu.main import run

if __name__ == "__main__":
    run()
