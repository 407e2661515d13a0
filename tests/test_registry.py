"""One contract registry (conformance/contracts.toml): every ID has a test, every marker is registered,
and the report lists registered contracts that did not run (the manual's contract pages are generated
from it: tests/test_docs.py).

Cost: the registry checks read source files (milliseconds); three small pytester runs, no world.
"""

import ast
import re

import pytest

from conftest import ROOT
from pytest_zero3 import registry

USAGE = pytest.ExitCode.USAGE_ERROR


def markers_in_suite() -> dict:
    """``{id: [(file, line, statement or None)]}`` of every zero3_contract marker in conformance/."""
    found = {}
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "zero3_contract":
                values = dict(zip(("id", "statement"), (ast.literal_eval(a) for a in node.args)))
                values.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
                found.setdefault(values["id"], []).append((path.name, node.lineno, values.get("statement")))
    return found


def test_every_registered_contract_has_a_test_and_every_marker_is_registered():
    """Why: a registered contract without a test is a promise nobody checks; a marker with an
    unregistered ID is a contract the report, the manual and --zero3-select cannot describe."""
    known, used = registry.load(), markers_in_suite()
    assert known, "conformance/contracts.toml lists no contract"
    assert not sorted(set(known) - set(used)), (
        f"registered but no test carries the marker: {sorted(set(known) - set(used))}"
    )
    assert not sorted(set(used) - set(known)), f"markers naming unregistered IDs: {sorted(set(used) - set(known))}"
    stale = [
        (cid, f, line)
        for cid, places in used.items()
        for f, line, text in places
        if text is not None and text != known[cid].statement
    ]
    assert not stale, f"markers whose statement differs from the registry's (give the ID only): {stale}"
    for cid, c in known.items():
        assert re.fullmatch(r"[0-9a-z]+-[a-z]", cid) and c.family == cid.split("-")[0], cid
        assert c.statement and c.source and c.min_world_size >= 1, cid


@pytest.mark.parametrize(
    "marker, message",
    [
        ('zero3_contract("000-a", stament="typo")', "unknown keyword stament; it takes id= and statement="),
        ('zero3_contract("999-z")', "'999-z' is not in conformance/contracts.toml; register it there, or give"),
        ('zero3_contract("000-a", id="000-b")', "id given both by position and by keyword"),
        ("zero3_contract()", "give the contract ID"),
    ],
)
def test_bad_contract_markers_are_usage_errors_naming_the_test(pytester, marker, message):
    pytester.makepyfile(test_m=f"import pytest\n\n@pytest.mark.{marker}\ndef test_c():\n    pass\n")
    result = pytester.runpytest("-p", "no:hypothesispytest")  # in this process: no world starts
    assert result.ret == USAGE, result.outlines
    assert "test_m.py::test_c: @pytest.mark.zero3_contract" in result.stderr.str()
    assert message in result.stderr.str()


def test_an_unregistered_contract_is_a_usage_error_under_zero3_options(pytester):
    """Why: a contract's author runs the new test with ``--zero3-impl``; the end of collection read the
    bad marker again and turned the usage error into an INTERNALERROR."""
    pytester.makepyfile(test_m='import pytest\n\n@pytest.mark.zero3_contract("999-z")\ndef test_c():\n    pass\n')
    # an active plugin owns its process's exit: a subprocess
    result = pytester.runpytest_subprocess("test_m.py", "-p", "no:hypothesispytest", "--zero3-impl=installed")
    assert result.ret == USAGE, result.outlines
    assert "'999-z' is not in conformance/contracts.toml" in result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_keyword_markers_and_not_run_rows(pytester):
    """Why: `zero3_contract(id=..., statement=...)` is the natural spelling for one's own contract,
    and a registered contract that was selected but never ran must not vanish from the report."""
    pytester.makepyfile(
        test_k="""
        import pytest

        @pytest.mark.zero3_contract(id="000-a")
        def test_registered():
            pass

        @pytest.mark.zero3_contract(id="950-a", statement="my own contract")
        def test_own():
            pass
    """
    )
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "test_k.py", "-p", "no:hypothesispytest", f"--zero3-report={report}", "--zero3-select=000,950"
    )
    assert result.ret == 0, result.outlines
    import json

    rows = {r["id"]: r for r in json.loads(report.read_text())["contracts"]}
    assert rows["000-a"]["outcome"] == "pass" and rows["000-a"]["source"] == registry.load()["000-a"].source
    assert rows["950-a"] == {**rows["950-a"], "outcome": "pass", "statement": "my own contract", "source": ""}
    assert {cid for cid, r in rows.items() if r["outcome"] == "not_run"} == {
        cid for cid in registry.load() if cid.startswith("000-") and cid != "000-a"
    }
    result.stdout.fnmatch_lines(["*000-b *not run*"])


def test_opt_in_contracts_run_only_when_selected():
    """Why: a family too slow for the default run (``opt_in = true``, the frameworks family) must neither
    run nor show as "not run" there, and must run whenever ``--zero3-select`` names it."""
    from pytest_zero3 import markers

    opt_in = sorted(cid for cid, c in registry.load().items() if c.opt_in)
    assert opt_in and all(registry.family(cid) == "fw" for cid in opt_in), opt_in
    assert not any(markers.selected(cid, []) for cid in opt_in)
    assert all(markers.selected(cid, ["fw"]) for cid in opt_in)
    assert markers.selected(opt_in[0], [opt_in[0]]) and markers.selected("000-a", [])
