"""Run by tests/test_report.py: three contracts whose outcomes are known in advance."""

import pytest

from pytest_zero3 import scenario


def count_ranks():
    return scenario.rank()


def only_rank_zero_agrees():
    scenario.agree(scenario.rank() == 0, "rank is not 0")


def feature_missing():
    scenario.unsupported("config rejects stage3_adaptive_prefetch_bucket_size")


@pytest.mark.zero3_contract("900-a", "ranks count from zero")
def test_pass(zero3_world):
    assert zero3_world.run(count_ranks) == [0, 1]


@pytest.mark.zero3_contract("900-b", "every rank is rank zero")
def test_fail(zero3_world):
    zero3_world.run(only_rank_zero_agrees)


@pytest.mark.zero3_contract("901-a", "the adaptive bucket keys are accepted")
def test_unsupported(zero3_world):
    zero3_world.run(feature_missing)
