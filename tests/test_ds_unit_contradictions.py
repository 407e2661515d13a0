"""The DeepSpeed unit tests the reference fails on purpose (conformance/ds_unit_contradictions.toml) and
the verdict of scripts/ds-unit-tests.sh over both runs, on hand-made results: no DeepSpeed test runs
here (the script is a proof run), milliseconds.
"""

import importlib.util
import pathlib
import sys

import pytest

from pytest_zero3 import registry

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "ds_unit" / "ds_unit.py"


@pytest.fixture(scope="module")
def ds_unit():
    spec = importlib.util.spec_from_file_location("ds_unit", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ds_unit"] = mod  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["ds_unit"]
    return mod


def test_every_contradiction_names_a_registered_contract_and_a_reason(ds_unit):
    """Why: an excused DeepSpeed test must point at the contract that makes the reference fail it, or the
    exemption is an unexplained hole in "the reference passes DeepSpeed's own tests"."""
    entries = ds_unit.load_contradictions()
    assert entries, "conformance/ds_unit_contradictions.toml lists no test"
    known = registry.load()
    unknown = {t: e.contract for t, e in entries.items() if e.contract not in known}
    assert not unknown, f"entries naming unregistered contracts: {unknown}"
    assert all(len(e.reason) > 20 for e in entries.values())


def test_a_malformed_entry_is_refused_naming_it(ds_unit, tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[tests."tests/unit/x/test_a.py::test_b"]\ncontract = "000-a"\nreasn = "typo"\n')
    with pytest.raises(ValueError, match=r"test_a.py::test_b.*lacks reason; has unknown reasn"):
        ds_unit.load_contradictions(str(bad))
    bad.write_text('[tests."unit/x/test_a.py::test_b"]\ncontract = "000-a"\nreason = "r"\n')
    with pytest.raises(ValueError, match="relative to the DeepSpeed checkout"):
        ds_unit.load_contradictions(str(bad))


def test_only_an_unlisted_test_stock_passes_fails_the_run(ds_unit):
    """A reference failure where stock passes fails the run unless listed; a listed test the reference
    passes is reported as stale; a test both sides fail is stock's problem, not the reference's."""

    def run(**outcomes):
        return {"results": {f"tests/unit/t.py::{k}": {"outcome": v, "message": ""} for k, v in outcomes.items()}}

    listed = {
        "tests/unit/t.py::excused": ds_unit.Contradiction("tests/unit/t.py::excused", "000-a", "why"),
        "tests/unit/t.py::fixed": ds_unit.Contradiction("tests/unit/t.py::fixed", "base-j", "why"),
    }
    stock = run(new="passed", excused="passed", fixed="passed", both="failed", lost="passed", same="skipped")
    ref = run(new="failed", excused="failed", fixed="passed", both="failed", same="skipped")
    rows, new, stale = ds_unit.compare(stock, ref, listed)
    assert new == ["tests/unit/t.py::lost", "tests/unit/t.py::new"]
    assert stale == ["tests/unit/t.py::fixed"]
    notes = {t.split("::")[1]: n for t, _, _, n in rows}
    assert notes["excused"] == "contradicts 000-a" and notes["both"] == "" and notes["same"] == ""
    assert ds_unit.totals(rows, 2) == "1 passed, 3 failed, 1 skipped, 1 not run"
