"""Run by tests/test_lifecycle.py (``-p held_plugin``): the session keeps its forkservers warm, as a
suite's own tests do (``spawner.held``), so its forkserver is forked from a zygote."""

import pytest

from pytest_zero3 import spawner


@pytest.fixture(autouse=True, scope="session")
def _held():
    with spawner.held():
        yield
