"""`python -m client.batch`: embed a large file through the service (see client/batch/cli.py)."""

import sys

from client.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
