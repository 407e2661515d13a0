"""One contract registry (conformance/contracts.toml): every ID has a test, every marker is registered,
and the report lists registered contracts that did not run (the manual's contract pages are generated
from it: tests/test_docs.py).

Cost: the registry checks read source files (milliseconds); three small pytester runs, no world.
"""

import ast
import re

import pytest
from pytest_zero3.fixtures import contract

from conftest import ROOT
from pytest_zero3 import registry

USAGE = pytest.ExitCode.USAGE_ERROR


def markers_in_suite() -> dict:
    """``{id: [(file, line, statement or None)]}`` of every zero3_contract marker in conformance/ (the batched
    families, rule and zoo, whose one world serves several contracts)."""
    found = {}
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "zero3_contract":
                values = dict(zip(("id", "statement"), (ast.literal_eval(a) for a in node.args)))
                values.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
                found.setdefault(values["id"], []).append((path.name, node.lineno, values.get("statement")))
    return found


def test_every_registered_contract_has_one_scenario_and_every_scenario_is_registered():
    """Why: a registered contract without a scenario is a promise nobody checks, one with two is two
    rules under one name; a scenario whose ID is not registered is a contract the report, the manual and
    --zero3-select cannot describe.  A contract is one decorated scenario (``@contract`` under fixtures/),
    or, in the batched families, one marked test in conformance/; never both."""
    known, decorated, marked = registry.load(), contract.scenarios(), markers_in_suite()
    assert known, "conformance/contracts.toml lists no contract"
    twice = {cid: [f"{s.module}.{s.function}" for s in found] for cid, found in decorated.items() if len(found) > 1}
    assert not twice, f"contracts with more than one scenario: {twice}"
    both = sorted(set(decorated) & set(marked))
    assert not both, f"contracts with a scenario and a marked test: {both}"
    homes = set(decorated) | set(marked)
    assert not sorted(set(known) - homes), f"registered but no scenario: {sorted(set(known) - homes)}"
    assert not sorted(homes - set(known)), f"scenarios or markers naming unregistered IDs: {sorted(homes - set(known))}"
    stale = [
        (cid, f, line)
        for cid, places in marked.items()
        for f, line, text in places
        if text is not None and text != known[cid].statement
    ]
    assert not stale, f"markers whose statement differs from the registry's (give the ID only): {stale}"
    for cid, c in known.items():
        assert re.fullmatch(r"[0-9a-z]+-[a-z]", cid) and c.family == cid.split("-")[0], cid
        assert c.statement and c.source and c.min_world_size >= 1, cid


def test_no_conformance_module_is_named_by_a_family_number():
    """Why: which module a contract belongs to is a question of topic, not of history (issue 56)."""
    numbered = sorted(p.name for p in (ROOT / "conformance").glob("test_[0-9]*.py"))
    numbered += sorted(p.name for p in (ROOT / "fixtures").rglob("*.py") if re.match(r"(family_|test_)?\d{3}", p.name))
    assert not numbered, numbered


def test_a_contract_decorator_that_cannot_be_read_statically_names_the_fix(tmp_path):
    """Why: pytest's process reads the decorators from the source; a computed argument would be a
    contract collected wrongly, or not at all, so it is refused with the file and line."""
    (tmp_path / "topic.py").write_text(
        'from pytest_zero3.fixtures.contract import contract\n\nWIDTH = 4\nSIZES = {"a": WIDTH, "b": 2}\n\n\n'
        '@contract("900-a", variants=SIZES, timeout=60)\ndef ok(variant):\n    """Why."""\n\n\n'
        '@contract("900-b", what=f"{WIDTH}")\ndef computed():\n    pass\n'
    )
    with pytest.raises(contract.ContractError, match=r"topic\.py:12: @contract's arguments must be literals"):
        contract.scenarios(str(tmp_path))
    (tmp_path / "topic.py").write_text((tmp_path / "topic.py").read_text().split('\n\n\n@contract("900-b"')[0])
    contract._scenarios.cache_clear()
    (found,) = contract.scenarios(str(tmp_path))["900-a"]
    assert (found.module, found.function, found.variants, found.timeout, found.doc) == (
        "pytest_zero3.fixtures.topic",
        "ok",
        ("a", "b"),
        60,
        "Why.",
    )


def test_collecting_the_suite_imports_no_torch(pytester):
    """Why: the contracts are read from their decorators, so collecting the suite (pytest's process)
    imports no scenario module, and so neither torch nor deepspeed."""
    pytester.makeconftest(
        "import sys\n\ndef pytest_collection_finish(session):\n"
        "    print('HEAVY', sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))\n"
    )
    result = pytester.runpytest_subprocess(
        "--pyargs",
        "pytest_zero3.conformance",
        "--collect-only",
        "-q",
        "-p",
        "no:hypothesispytest",
        "--zero3-impl=installed",
        "--zero3-select=000,base",
        "-n",
        "0",
        "-s",
    )
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(["HEAVY []"])


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
