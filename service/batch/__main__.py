"""`python -m service.batch`: embed a large file through the service (see service/batch/cli.py)."""

import sys

from service.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
