"""Shared pytest fixtures, one module per area (tests/fixtures/): model directories, servers."""

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.server",
    "tests.fixtures.classifiers",
    "tests.fixtures.chat",
    "tests.fixtures.sparse",
]
