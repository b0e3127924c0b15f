"""Entry point: `python -m bench.lockstep [--quick] [--output DIR] ...`."""

import sys

from bench.lockstep import cli

if __name__ == "__main__":
    sys.exit(cli.main())
