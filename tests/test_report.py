"""The conformance report, expectations, --zero3-select and the console script (issue 8)."""

import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import ROOT

CASE = str(ROOT / "tests" / "data" / "contracts_case.py")


def test_table_json_markdown_and_junit(run_pytest, tmp_path):
    md, junit = tmp_path / "r.md", tmp_path / "junit.xml"
    run = run_pytest(CASE, f"--zero3-report-md={md}", f"--junitxml={junit}")
    assert run.returncode == 1
    out = run.stdout
    assert "ZeRO-3 conformance" in out and "implementation: installed (installed deepspeed)" in out
    assert "contracts: 1 pass, 1 FAIL, 1 unsupported (of 3 checked)" in out
    assert "900-b   every rank is rank zero" in out and "rank 0 raised: AssertionError: [rank 1] rank is not 0" in out
    assert "UNSUPPORTED" not in out or "unsupported: config rejects" in out

    doc = run.report
    assert (doc["schema"], doc["version"]) == ("pytest-zero3/report", 2)
    assert doc["summary"] == {
        "pass": 1,
        "fail": 1,
        "unsupported": 1,
        "known_failure": 0,
        "unexpected_pass": 0,
        "skipped": 0,
        "not_run": 0,
        "total": 3,
    }
    assert doc["implementation"]["backend"] == "gloo" and doc["implementation"]["world_size"] == 2
    assert doc["implementation"]["coordinator"].endswith("PartitionedParameterCoordinator")
    rows = {c["id"]: c for c in doc["contracts"]}
    assert rows["900-b"]["family"] == "900" and rows["900-b"]["statement"] == "every rank is rank zero"
    assert {r["rank"] for r in rows["900-b"]["ranks"]} == {0, 1}
    assert "rank is not 0" in rows["900-b"]["ranks"][0]["message"]
    assert rows["901-a"]["outcome"] == "unsupported" and "stage3_adaptive" in rows["901-a"]["reason"]
    assert rows["900-a"]["duration"] > 0 and rows["900-a"]["tests"] == ["tests/data/contracts_case.py::test_pass"]

    assert "| 900-b | every rank is rank zero | **FAIL** |" in md.read_text()
    props = {
        (tc.get("name"), p.get("name"), p.get("value"))
        for tc in ET.parse(junit).iter("testcase")
        for p in tc.iter("property")
    }
    assert ("test_fail", "zero3_contract", "900-b") in props


def test_expectations_known_failure_unexpected_pass_and_unknown_id(run_pytest, tmp_path):
    expect = tmp_path / "expect.toml"
    expect.write_text(
        "# known for this implementation\n[expected_failures]\n"
        '"900-b" = "by construction"\n"900-a" = "listed but passes"\n"999-z" = "no such contract"\n'
        '"000-a" = "a registered contract this run does not collect"\n'
    )
    run = run_pytest(CASE, f"--zero3-expect={expect}")
    assert run.returncode == 0, run.stdout
    assert run.outcomes() == {"900-a": "unexpected_pass", "900-b": "known_failure", "901-a": "unsupported"}
    known = {c["id"]: c for c in run.report["contracts"]}["900-b"]  # the failure stays visible behind the reason
    assert known["reason"] == "by construction" and "rank is not 0" in known["message"]
    assert "--zero3-expect lists '999-z', which is no registered contract" in run.stdout
    assert "lists '000-a'" not in run.stdout  # deselected, not mistaken: an expectations file serves many runs
    strict = run_pytest(CASE, f"--zero3-expect={expect}", "--zero3-strict")
    assert strict.returncode == 1
    assert "--zero3-strict: contract 900-a passed but --zero3-expect lists it as failing" in strict.stdout


def test_select_runs_only_matching_contracts(run_pytest):
    run = run_pytest(CASE, "--zero3-select=901")
    assert run.returncode == 0 and run.outcomes() == {"901-a": "unsupported"}
    assert "2 deselected" in run.stdout


def test_console_script_runs_the_installed_suite():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_zero3.cli", "--co", "-q", "--zero3-select=base-a"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "conformance/test_baseline.py::test_mlp_parity_prefetch_off" in out.stdout
