"""The contract registry: ``conformance/contracts.toml``, one table per contract ID.

One place for what a contract is (family, one-line statement, source, the ranks it needs); markers
carry only the ID.  The report lists registered contracts that did not run, and
``tests/test_registry.py`` checks that every registered ID has a test and every marker is registered.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os

from pytest_zero3._compat import tomllib

FIELDS = ("family", "statement", "source", "min_world_size")
#: Fields an entry may leave out, with their value then.  ``opt_in``: the contract runs only when
#: ``--zero3-select`` names it (a family too slow for the default run; the README says which).
OPTIONAL = {"opt_in": False}


@dataclasses.dataclass(frozen=True)
class Contract:
    id: str
    family: str
    statement: str
    source: str
    min_world_size: int = 1
    opt_in: bool = False


def path() -> str:
    """The registry file of the installed (or checked-out) conformance package."""
    spec = importlib.util.find_spec("pytest_zero3.conformance")
    assert spec is not None and spec.submodule_search_locations is not None, "pytest_zero3.conformance is a package"
    return os.path.join(list(spec.submodule_search_locations)[0], "contracts.toml")


def field_problems(missing, unknown) -> str:
    """What is wrong with a TOML table's fields ("lacks x; has unknown y"), "" when nothing: one wording
    for the registry and the DeepSpeed unit-test contradictions file (scripts/ds_unit/ds_unit.py)."""
    return "; ".join(
        ([f"lacks {', '.join(missing)}"] if missing else [])
        + ([f"has unknown {', '.join(unknown)}"] if unknown else [])
    )


@functools.cache
def load(file: str = "") -> dict:
    """``{id: Contract}``; a malformed entry raises ValueError naming the ID and the field."""
    with open(file or path(), "rb") as fh:
        table = tomllib.load(fh).get("contracts", {})
    out = {}
    for cid, entry in table.items():
        unknown = sorted(set(entry) - set(FIELDS) - set(OPTIONAL))
        problem = field_problems([f for f in FIELDS if f not in entry], unknown)
        if problem:
            raise ValueError(f"contracts.toml: [contracts.{cid!r}] {problem}")
        out[cid] = Contract(cid, **{f: entry.get(f, OPTIONAL.get(f)) for f in (*FIELDS, *OPTIONAL)})
    return out


def opt_in(cid: str) -> bool:
    """Whether ``cid`` is a registered contract that runs only when ``--zero3-select`` names it."""
    contract = load().get(cid)
    return bool(contract and contract.opt_in)


def family(cid: str) -> str:
    """The family of an ID: the part before the first dash (``000-a`` -> ``000``)."""
    return cid.split("-", 1)[0]
