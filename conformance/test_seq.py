"""Contract family ``seq``: the surface as a state machine over drawn models, configs and action sequences.

Spec: DeepSpeed's public ZeRO-3 entry points (conformance/surface.toml) promise what plain torch
computes, whatever model, config and order of calls they meet.  Each example draws a model from
features, a config at the model's own sizes and a sequence of actions; after every action the engine
is judged against the twin.  :mod:`pytest_zero3.fixtures.seq` draws, runs, shrinks and replays.
"""

from __future__ import annotations

import pytest
from pytest_zero3.fixtures.pytest_side import seq_batch as batch

from pytest_zero3 import expectations, options, report


@pytest.fixture(scope="session")
def zero3_seq_batch(request, tmp_path_factory):
    config = request.config
    cache = getattr(config, "cache", None)
    failures = (
        str(cache.mkdir("zero3-seq-failures")) if cache is not None else str(tmp_path_factory.mktemp("seq-failures"))
    )
    settings = options.settings(config)
    expected = expectations.load(settings.expect).get("seq-a")
    return batch.Batch(settings, failures, str(tmp_path_factory.mktemp("seq")), expected)


@pytest.mark.zero3_timeout(600)
@pytest.mark.zero3_contract("seq-a")
def test_seq(zero3_world, zero3_seq_batch, record_property):
    """Why: each hand-written contract drives its entry point on the model and config its author picked;
    the bugs forks bring live where two features meet (a tied frozen embedding converted without frozen
    params, a gradient that exactly fills the bucket with reduce-scatter off)."""
    record_property(report.PAIRS_PROPERTY, zero3_seq_batch.coverage())
    try:
        zero3_seq_batch.check(zero3_world)
    finally:  # the family's own cost, in the ranks' CPU seconds (junit XML's properties carry it)
        record_property("zero3_seq_cpu_s", zero3_seq_batch.cpu_seconds())
