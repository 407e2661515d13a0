"""The markers pytest-zero3 registers, and reading them from test items."""
from __future__ import annotations

import pytest

_PRELOADS = pytest.StashKey()

MARKERS = (
    "zero3_contract(id, statement): the test checks ZeRO-3 contract `id` (e.g. '000-a'); "
    "`statement` is its one-line text, shown in the conformance report.",
    "zero3_world_size(n): run this test's scenarios on worlds of n ranks.",
    "zero3_timeout(seconds): per-scenario timeout for this test.",
    "zero3_preload(*modules): modules the ranks import (loaded once in the forkserver).",
)


def register(config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def contract(item):
    """``(id, statement)`` of the item's ``zero3_contract`` marker, or None."""
    mark = item.get_closest_marker("zero3_contract")
    if mark is None:
        return None
    args = list(mark.args) + [mark.kwargs.get("statement", "")]
    return str(args[0]), str(args[1])


def world_size(item, default: int) -> int:
    mark = item.get_closest_marker("zero3_world_size")
    return int(mark.args[0]) if mark else default


def timeout(item, default: float) -> float:
    mark = item.get_closest_marker("zero3_timeout")
    return float(mark.args[0]) if mark else default


def collect_preloads(config, items) -> None:
    mods = set()
    for item in items:
        for mark in item.iter_markers("zero3_preload"):
            mods.update(mark.args)
    config.stash[_PRELOADS] = sorted(mods)


def preloads(config) -> list:
    return config.stash.get(_PRELOADS, [])


def select_contracts(config, items) -> None:
    """Apply ``--zero3-select``: deselect contract tests whose ID matches none of the prefixes."""
    value = config.getoption("--zero3-select")
    if not value:
        return
    prefixes = [p.strip() for p in value.split(",") if p.strip()]
    keep, drop = [], []
    for item in items:
        c = contract(item)
        (keep if c and any(c[0] == p or c[0].startswith(p.rstrip("-") + "-") or c[0].startswith(p)
                           for p in prefixes) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
