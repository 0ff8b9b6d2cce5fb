"""`python -m client` (= `ts-client`): see client/cli.py."""

import sys

from client.cli import main

if __name__ == "__main__":
    sys.exit(main())
