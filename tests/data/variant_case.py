"""Run by tests/test_report.py: a contract whose variants fail for different causes."""

import pytest

CAUSES = {"a": "the first bug", "b": "the second bug", "c": ""}


@pytest.mark.parametrize("variant", tuple(CAUSES))
@pytest.mark.zero3_contract("900-a", "ranks count from zero")
def test_per_variant(variant):
    assert not CAUSES[variant], CAUSES[variant]
