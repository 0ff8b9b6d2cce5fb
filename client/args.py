"""Argument types and the parser of the client CLIs: a bad flag is one line on stderr and exit 2.

Counts are checked against the contract's field types (uint32, uint64) here, so a value protobuf
would refuse (`--max-new-tokens -1`) never reaches it. Every other rule (a layer that does not exist,
a negative temperature) is the server's: its INVALID_ARGUMENT message is printed as one line.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (`prog: error: what`) instead of the usage block; `-h` shows usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _integer(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is out of range: {what}")
    return value


def count(text: str) -> int:
    """A uint32 of the contract: an integer from 0 to 2**32 - 1."""
    return _integer(text, 0, UINT32_MAX, "must be >= 0")


def seed(text: str) -> int:
    """A uint64 of the contract."""
    return _integer(text, 0, UINT64_MAX, "must be from 0 to 2**64 - 1")


def seconds(text: str) -> float:
    """A deadline: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{value} is out of range: must be > 0 seconds")
    return value


def indices(text: str) -> list[int]:
    """Comma-separated uint32 indices, e.g. `0,5`."""
    try:
        return [count(x) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated indices >= 0 ({e})") from None


def fail(message: str) -> NoReturn:
    """Ends a command with one line on stderr and exit 2 (a bad argument found after parsing)."""
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)
