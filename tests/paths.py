"""Paths the tests read: the repository root and the tests' own data folder."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
CHECKPOINTS = ROOT / "checkpoints"
