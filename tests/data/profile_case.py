"""Run by tests/test_report.py: a contract whose test fails under one config profile only."""

import pytest


@pytest.mark.parametrize("zero3_profile", ["fp32", "hpz"])
@pytest.mark.zero3_contract("900-a", "ranks count from zero")
def test_per_profile(zero3_profile):
    assert zero3_profile != "hpz", "the hpz axis breaks it"
