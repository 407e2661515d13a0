"""Contract family ``rule``: every hook event of generated scenarios judged against the rule model.

Spec: the ZeRO-3 config docs (``stage3_max_reuse_distance``, ``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters``, ``stage3_param_persistence_threshold``) and DeepSpeed PRs 9003, 8883,
8148 and 8431 (the seeds), as written down, one rule per contract, in :mod:`pytest_zero3.fixtures.rule.rules`.

Examples: fixed anchors (each aimed at one rule, so every run covers every rule, and one per bug the
family found) plus ``--zero3-examples`` drawn by hypothesis, or only the examples of
``--zero3-replay``; :mod:`pytest_zero3.fixtures.pytest_side` plans, generates, batches, shrinks, saves
and replays them.  The session runs the batch once (also under pytest-xdist) and the parent judges the
records, so each contract below reads the same run.
"""

from __future__ import annotations

import pytest
from pytest_zero3.fixtures.pytest_side import rule_batch, rule_plan

from pytest_zero3 import expectations, options


@pytest.fixture(scope="session")
def zero3_rule_batch(request, tmp_path_factory):
    """The session's :class:`pytest_zero3.fixtures.pytest_side.rule_batch.Batch`: every rule test reads its one run."""
    config = request.config
    settings = options.settings(config)
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    if cache is not None:
        failures = str(cache.mkdir("zero3-rule-failures"))
    else:
        failures = str(tmp_path_factory.getbasetemp() / "zero3-rule-failures")
    # under pytest-xdist every worker's temp dir sits in the controller's, which is this session's alone
    shared = str(tmp_path_factory.getbasetemp().parent) if hasattr(config, "workerinput") else None
    expected = expectations.load(settings.expect)  # checked already: a listed rule's cause, per example
    return rule_batch.Batch(settings, rule_plan.plan(settings), failures, shared, expected)


@pytest.mark.zero3_timeout(600)
@pytest.mark.xdist_group(rule_batch.XDIST_GROUP)
@pytest.mark.parametrize(
    "rule",
    [
        pytest.param("rule-a", marks=pytest.mark.zero3_contract("rule-a"), id="rule-a"),
        pytest.param("rule-b", marks=pytest.mark.zero3_contract("rule-b"), id="rule-b"),
        pytest.param("rule-c", marks=pytest.mark.zero3_contract("rule-c"), id="rule-c"),
        pytest.param("rule-d", marks=pytest.mark.zero3_contract("rule-d"), id="rule-d"),
        pytest.param("rule-e", marks=pytest.mark.zero3_contract("rule-e"), id="rule-e"),
        pytest.param("rule-f", marks=pytest.mark.zero3_contract("rule-f"), id="rule-f"),
        pytest.param("rule-g", marks=pytest.mark.zero3_contract("rule-g"), id="rule-g"),
        pytest.param("rule-h", marks=pytest.mark.zero3_contract("rule-h"), id="rule-h"),
    ],
)
def test_rule(zero3_world, zero3_rule_batch, rule):
    """Why: the hand-written contracts pin the four historical bugs; these pin the rules themselves,
    judged at every hook event, where DeepSpeed's end-of-backward and end-of-step safety nets have not
    cleaned up yet."""
    zero3_rule_batch.check(zero3_world, rule)
