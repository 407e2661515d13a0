"""Run by tests/test_lifecycle.py: the forkserver's preload of this test's module never finishes."""

import pytest


def nothing():
    return None


@pytest.mark.zero3_preload("blocking_import")
def test_never_starts(zero3_world):
    zero3_world.run(nothing)
