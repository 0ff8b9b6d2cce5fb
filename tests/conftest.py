"""Shared pytest fixtures, one module per area (tests/fixtures/): model directories, servers."""

import os

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.server",
    "tests.fixtures.classifiers",
    "tests.fixtures.chat",
    "tests.fixtures.sparse",
]

# Servers started by the tests (in process through tests/fixtures/server.py, and every subprocess)
# run the packed graph where a model has one, not the layout a timing at load picks: tests that
# compare two servers or two layouts need to know which ran. The auto choice has its own tests
# (tests/service/embedding/test_encoder_layout.py).
os.environ.setdefault("TS_ENCODER_LAYOUT", "packed")
