"""Entry point: `python -m bench [--quick] [--output DIR] ...`."""

import sys

from bench import cli

if __name__ == "__main__":
    sys.exit(cli.main())
