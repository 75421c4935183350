"""`python -m dpuoffload.host [training flags]` — app context 0 of the MPMD job (dpurun starts it)."""

from dpuoffload.host.main import run

if __name__ == "__main__":
    run()
