"""The markers pytest-zero3 registers, and reading them from test items."""

from __future__ import annotations

import math

import pytest

from pytest_zero3 import options, registry

_PRELOADS: pytest.StashKey[list] = pytest.StashKey()

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


def profile(item) -> str:
    """The config profile the item runs under: its ``zero3_profile`` parameter (the conformance suite
    parametrises it under ``--zero3-profile``), else ``fp32``, the default."""
    callspec = getattr(item, "callspec", None)
    return (callspec.params.get("zero3_profile") if callspec else None) or "fp32"


def variant(item) -> str | None:
    """The variant of a contract test parametrised by ``variant`` (an expectation may list some), else None."""
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("variant") if callspec else None
    return None if value is None else str(value)


def check(items) -> None:
    """Read every zero3 marker once, at collection, as pytest-timeout checks its own: a bad one is a
    usage error naming the test, before any world starts."""
    errors = []
    for item in items:
        for read in (contract, _checked_world_size, _checked_timeout):
            try:
                read(item)
            except MarkerError as exc:
                errors.append(str(exc))
    if errors:
        raise pytest.UsageError("\n".join(errors))


def _one_argument(item, name: str, example: str):
    """The single positional argument of the item's ``name`` marker (None without the marker)."""
    mark = item.get_closest_marker(name)
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs:
        given = ", ".join([*map(repr, mark.args), *(f"{k}={v!r}" for k, v in mark.kwargs.items())])
        raise MarkerError(f"{item.nodeid}: @pytest.mark.{name} takes one argument, e.g. {example}; got ({given}).")
    return mark.args[0]


def _checked_world_size(item):
    n = _one_argument(item, "zero3_world_size", "zero3_world_size(2)")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise MarkerError(
            f"{item.nodeid}: @pytest.mark.zero3_world_size({n!r}): give a positive whole number of ranks, "
            "e.g. zero3_world_size(2)."
        )
    return n


def _checked_timeout(item):
    s = _one_argument(item, "zero3_timeout", "zero3_timeout(60)")
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s > 0)):
        raise MarkerError(
            f"{item.nodeid}: @pytest.mark.zero3_timeout({s!r}): give a positive, finite number of seconds, "
            "e.g. zero3_timeout(60)."
        )
    return s


def world_size(item, default: int) -> int:
    """The item's ``zero3_world_size``, else ``default``; checked at collection by :func:`check`."""
    n = _checked_world_size(item)
    return default if n is None else int(n)


def timeout(item, default: float) -> float:
    """The item's ``zero3_timeout``, else ``default``; checked at collection by :func:`check`."""
    s = _checked_timeout(item)
    return default if s is None else float(s)


def collect_preloads(config, items) -> None:
    mods = set()
    for item in items:
        for mark in item.iter_markers("zero3_preload"):
            mods.update(mark.args)
    config.stash[_PRELOADS] = sorted(mods)


def preloads(config) -> list:
    return config.stash.get(_PRELOADS, [])


def selected(cid: str, prefixes) -> bool:
    """Whether ``cid`` matches one of the ``--zero3-select`` prefixes (an empty list selects every
    contract but the opt-in ones, :func:`pytest_zero3.registry.opt_in`)."""
    if not prefixes:
        return not registry.opt_in(cid)
    return any(cid == p or cid.startswith(p.rstrip("-") + "-") or cid.startswith(p) for p in prefixes)


def select_prefixes(config) -> list:
    return list(options.settings(config).select)


def check_select(prefixes, collected=()) -> None:
    """A ``--zero3-select`` prefix that matches no registered and no collected contract ID is a usage
    error listing the families."""
    known = set(collected) | set(registry.load())
    unmatched = [p for p in prefixes if not any(selected(cid, [p]) for cid in known)]
    if unmatched:
        families = sorted({registry.family(cid) for cid in known})
        raise pytest.UsageError(
            f"--zero3-select: no contract ID starts with {', '.join(map(repr, unmatched))}. Give contract IDs "
            f"or prefixes of them (e.g. '000' or '001-a'); the families are: {', '.join(families)}."
        )


def distributing(config) -> bool:
    """Whether this process is a pytest-xdist controller: it collects nothing, its workers do."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def select_contracts(config, items) -> None:
    """Apply ``--zero3-select``: deselect contract tests whose ID matches none of the prefixes, after
    :func:`check_select` (under pytest-xdist the controller checked them against the registry, before
    any worker started)."""
    prefixes = select_prefixes(config)
    if not prefixes and not any(registry.opt_in(c[0]) for c in map(contract, items) if c):
        return
    if prefixes and not hasattr(config, "workerinput"):
        check_select(prefixes, {c[0] for c in map(contract, items) if c})
    keep: list = []
    drop: list = []
    for item in items:
        c = contract(item)
        (keep if c and selected(c[0], prefixes) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
