"""Run by tests/test_lifecycle.py: the forkserver's preload takes longer than the scenario timeout."""

import pytest

from pytest_zero3 import scenario


def my_rank():
    return scenario.rank()


@pytest.mark.zero3_preload("slow_import")
def test_starts_after_a_slow_preload(zero3_world):
    assert zero3_world.run(my_rank) == [0, 1]
