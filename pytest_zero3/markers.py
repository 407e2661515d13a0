"""The markers pytest-zero3 registers, and reading them from test items."""

from __future__ import annotations

import pytest

from pytest_zero3 import registry

_PRELOADS = pytest.StashKey()

MARKERS = (
    "zero3_contract(id, statement=None): the test checks ZeRO-3 contract `id` (e.g. '000-a'), registered in "
    "conformance/contracts.toml; a contract of your own that is not registered gives its one-line `statement`.",
    "zero3_world_size(n): run this test's scenarios on worlds of n ranks.",
    "zero3_timeout(seconds): per-scenario timeout for this test.",
    "zero3_preload(*modules): modules the ranks import (loaded once in the forkserver).",
)

CONTRACT_KEYWORDS = ("id", "statement")


def register(config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


class MarkerError(Exception):
    """A ``zero3_contract`` marker that cannot be read; the message names the fix."""


def contract(item):
    """``(id, statement)`` of the item's ``zero3_contract`` marker, or None.

    Accepts ``("ID")``, ``("ID", "statement")``, ``(id="ID")`` and ``(id="ID", statement="...")``; the
    statement of a registered ID comes from the registry.  Raises :class:`MarkerError` otherwise.
    """
    mark = item.get_closest_marker("zero3_contract")
    if mark is None:
        return None
    where = f"{item.nodeid}: @pytest.mark.zero3_contract"
    unknown = sorted(set(mark.kwargs) - set(CONTRACT_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"{where}: unknown keyword {', '.join(unknown)}; it takes id= and statement= "
            "(family, source and world size come from conformance/contracts.toml)."
        )
    if len(mark.args) > len(CONTRACT_KEYWORDS):
        raise MarkerError(f"{where}: takes the ID and an optional statement, got {len(mark.args)} arguments.")
    values = dict(zip(CONTRACT_KEYWORDS, mark.args))
    both = sorted(set(values) & set(mark.kwargs))
    if both:
        raise MarkerError(f"{where}: {', '.join(both)} given both by position and by keyword.")
    values.update(mark.kwargs)
    cid = values.get("id")
    if not isinstance(cid, str) or not cid:
        raise MarkerError(f'{where}: give the contract ID, e.g. zero3_contract("000-a").')
    known = registry.load().get(cid)
    statement = values.get("statement") or (known.statement if known else None)
    if not statement:
        raise MarkerError(
            f"{where}: {cid!r} is not in conformance/contracts.toml; register it there, or give "
            'the contract\'s one-line statement="..." in the marker.'
        )
    return cid, str(statement)


def check_contracts(items) -> None:
    """Read every contract marker once, at collection: a bad one is a usage error naming the test."""
    errors = []
    for item in items:
        try:
            contract(item)
        except MarkerError as exc:
            errors.append(str(exc))
    if errors:
        raise pytest.UsageError("\n".join(errors))


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


def selected(cid: str, prefixes) -> bool:
    """Whether ``cid`` matches one of the ``--zero3-select`` prefixes (an empty list selects all)."""
    return not prefixes or any(cid == p or cid.startswith(p.rstrip("-") + "-") or cid.startswith(p) for p in prefixes)


def select_prefixes(config) -> list:
    from pytest_zero3 import options

    return list(options.settings(config).select)


def select_contracts(config, items) -> None:
    """Apply ``--zero3-select``: deselect contract tests whose ID matches none of the prefixes."""
    prefixes = select_prefixes(config)
    if not prefixes:
        return
    keep, drop = [], []
    for item in items:
        c = contract(item)
        (keep if c and selected(c[0], prefixes) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
