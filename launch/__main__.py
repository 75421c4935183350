"""`python -m dpuoffload.launch` is `dpurun`."""

import sys

from dpuoffload.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
