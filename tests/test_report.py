"""The conformance report, expectations, --zero3-select and the console script (issue 8)."""

import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import BAD, ROOT

CASE = str(ROOT / "tests" / "data" / "contracts_case.py")


def test_table_json_markdown_and_junit(run_pytest, tmp_path):
    md, junit = tmp_path / "new" / "dirs" / "r.md", tmp_path / "junit.xml"  # report parents are created
    run = run_pytest(CASE, f"--zero3-report-md={md}", f"--junitxml={junit}", "-rs")
    assert run.returncode == 1
    out = run.stdout
    assert "ZeRO-3 conformance" in out and "implementation: installed (installed deepspeed)" in out
    assert "contracts: 1 pass, 1 FAIL, 1 unsupported (of 3 checked)" in out
    assert "900-b   every rank is rank zero" in out and "rank 0 raised: AssertionError: [rank 1] rank is not 0" in out
    # pytest makes the outcome: unsupported is its skip, with the reason, at the test's own line
    assert "SKIPPED [1] tests/data/contracts_case.py:30: pytest_zero3.scenario.Unsupported: config rejects" in out

    doc = run.report
    assert (doc["schema"], doc["version"]) == ("pytest-zero3/report", 4)
    assert doc["baseline"] is None and all(c["baseline"] is None and c["verdict"] == "" for c in doc["contracts"])
    assert doc["summary"] == {
        "pass": 1,
        "fail": 1,
        "world_error": 0,
        "unsupported": 1,
        "known_failure": 0,
        "unexpected_pass": 0,
        "skipped": 0,
        "not_run": 0,
        "total": 3,
        "problems_judged": 2,  # each rank of 900-b raised for itself: two problems, judged apart
        "problems_explained": 0,
    }
    assert "problems: 2 judged one by one, 0 explained by a known failure, 2 not" in out
    assert doc["implementation"]["backend"] == "gloo" and doc["implementation"]["world_size"] == 2
    assert doc["implementation"]["coordinator"].endswith("PartitionedParameterCoordinator")
    rows = {c["id"]: c for c in doc["contracts"]}
    assert rows["900-b"]["family"] == "900" and rows["900-b"]["statement"] == "every rank is rank zero"
    assert (rows["900-b"]["judged"], rows["900-b"]["explained"], rows["900-a"]["judged"]) == (2, 0, 0)
    # with no entry every problem is unexplained, each on one line, all of them listed
    assert len(rows["900-b"]["unexplained"]) == 2 and rows["900-a"]["unexplained"] == []
    assert all("rank is not 0" in u and "\n" not in u for u in rows["900-b"]["unexplained"])
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
    assert _junit(junit) == {"test_pass": None, "test_fail": "failure", "test_unsupported": "skipped"}
    assert render_matrix().validate(doc, render_matrix().schema()) == []


def _junit(path) -> dict:
    """``{test name: None (a pass) or the tag of its result: failure, error, skipped}`` from a junitxml file."""
    out = {}
    for tc in ET.parse(path).iter("testcase"):
        tags = [c.tag for c in tc if c.tag in ("failure", "error", "skipped")]
        out[tc.get("name")] = tags[0] if tags else None
    return out


def render_matrix():
    spec = importlib.util.spec_from_file_location("render_matrix", ROOT / "scripts" / "render_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_expectations_are_pytest_xfails_and_strict_is_pytests_strict(run_pytest, tmp_path):
    expect, junit = tmp_path / "expect.toml", tmp_path / "junit.xml"
    expect.write_text(
        "# known for this implementation\n[expected_failures]\n"
        '"900-b" = { reason = "by construction", raises = "AssertionError", match = "rank is not 0" }\n'
        '"900-a" = "listed but passes"\n"999-z" = "no such contract"\n'
        '"000-a" = "a registered contract this run does not collect"\n'
    )
    run = run_pytest(CASE, f"--zero3-expect={expect}", f"--junitxml={junit}", "-rxX")
    assert run.returncode == 0, run.stdout
    assert run.outcomes() == {"900-a": "unexpected_pass", "900-b": "known_failure", "901-a": "unsupported"}
    known = {c["id"]: c for c in run.report["contracts"]}["900-b"]  # the failure stays visible behind the reason
    assert known["reason"] == "by construction" and "rank is not 0" in known["message"]
    assert known["expected_cause"] == "raises AssertionError and matches 'rank is not 0'"
    assert "--zero3-expect lists '999-z', which is no registered contract" in run.stdout
    assert "lists '000-a'" not in run.stdout  # deselected, not mistaken: an expectations file serves many runs
    # pytest's own words and junitxml: a known failure is an xfail (skipped), not a pass
    assert "XFAIL tests/data/contracts_case.py::test_fail - known failure 900-b: by construction" in run.stdout
    assert "XPASS tests/data/contracts_case.py::test_pass - known failure 900-a: listed but passes" in run.stdout
    assert _junit(junit) == {"test_pass": None, "test_fail": "skipped", "test_unsupported": "skipped"}
    skipped = next(tc for tc in ET.parse(junit).iter("testcase") if tc.get("name") == "test_fail").find("skipped")
    assert skipped.get("type") == "pytest.xfail"

    strict = run_pytest(CASE, f"--zero3-expect={expect}", "--zero3-strict", "--zero3-select=900-a")
    assert strict.returncode == 1 and strict.outcomes() == {"900-a": "unexpected_pass"}
    assert "[XPASS(strict)] known failure 900-a: listed but passes" in strict.stdout  # pytest failed it
    assert "--zero3-strict: contract 900-a passed but --zero3-expect lists it as failing" in strict.stdout


def test_a_listed_contract_failing_for_another_cause_fails(run_pytest, tmp_path):
    """Why: an expectation that knows only the ID lets a second, different bug behind a listed
    contract pass the gate as "known failure"."""
    expect = tmp_path / "expect.toml"
    expect.write_text('[expected_failures]\n"900-b" = { reason = "a leak", match = "engines still alive" }\n')
    run = run_pytest(CASE, f"--zero3-expect={expect}", "--zero3-select=900-b")
    assert run.returncode == 1, run.stdout
    row = run.report["contracts"][0]
    assert row["outcome"] == "fail" and row["expected_cause"] == "matches 'engines still alive'"
    assert "expected: it matches 'engines still alive'; got: rank 0 raised: AssertionError: [rank 1]" in row["reason"]
    assert len(row["unexplained"]) == 2 and all("rank is not 0" in u for u in row["unexplained"])
    assert (
        "900-b is listed in --zero3-expect as failing because it matches 'engines still alive' (a leak), but it "
        "failed for another cause (above): rank 0 raised: AssertionError: [rank 1] rank is not 0" in run.stdout
    )


def test_runxfail_shows_known_failures_as_failures(run_pytest, tmp_path):
    expect = tmp_path / "expect.toml"
    expect.write_text('[expected_failures]\n"900-b" = { reason = "by construction", match = "rank is not 0" }\n')
    run = run_pytest(CASE, f"--zero3-expect={expect}", "--zero3-select=900-b", "--runxfail")
    assert run.returncode == 1 and run.outcomes() == {"900-b": "fail"}, run.stdout
    assert "known failure 900-b: by construction" in run.stdout and "rank is not 0" in run.stdout


def test_a_known_failure_explains_only_its_own_problems(tmp_path):
    """Issue 53: each problem of a failure must be one the entry's patterns explain; one problem no pattern
    finds makes the failure new (a CauseMismatch naming it), however many others the entry explains."""
    from pytest_zero3.fixtures import verdicts

    from pytest_zero3 import expectations

    path = tmp_path / "e.toml"
    path.write_text(
        '[expected_failures]\n"008-b" = { reason = "bug 10 and its fallout", match = '
        '["safe_set_full_grad\\\\(mid\\\\.bias\\\\) raised", "after step 3: safe_get_full_fp32_param of mid"] }\n'
    )
    entry = expectations.load(path)["008-b"]
    assert entry.patterns == (
        r"safe_set_full_grad\(mid\.bias\) raised",
        "after step 3: safe_get_full_fp32_param of mid",
    )

    def failure(*lines):
        try:
            verdicts.assert_clean([list(lines), list(lines)], "tensor-fragment writes (offload)")
        except AssertionError as exc:
            return exc
        raise AssertionError("assert_clean passed")

    known = failure(
        "step 3: safe_set_full_grad(mid.bias) raised RuntimeError",
        "after step 3: safe_get_full_fp32_param of mid.weight: 45 of 91",
    )
    assert entry.matches(known) and isinstance(expectations.judge("008-b", entry, known), expectations.KnownFailure)
    second = failure(
        "step 3: safe_set_full_grad(mid.bias) raised RuntimeError",
        "after step 1: engine.get_global_grad_norm() is 0.33",
    )
    assert entry.unexplained(second) == [
        "tensor-fragment writes (offload):\n  ranks 0, 1: after step 1: engine.get_global_grad_norm() is 0.33"
    ]
    judged = expectations.judge("008-b", entry, second)
    assert isinstance(judged, expectations.CauseMismatch)
    assert "behind the known failure of 008-b" in str(judged) and "1 of 2 problems" in str(judged)
    assert judged.first_unexplained.endswith("after step 1: engine.get_global_grad_norm() is 0.33")
    # every problem is judged, not only the lines the assertion's message shows
    many = failure(*[f"step 3: safe_set_full_grad(mid.bias) raised {i}" for i in range(30)], "a new problem")
    assert len(expectations.problems(many)) == 31 and entry.unexplained(many)[-1].endswith("a new problem")
    # a failure with no problem list is one problem: its whole text
    assert expectations.problems(RuntimeError("boom")) == ["boom"]


def test_expectations_file_forms(tmp_path):
    """The plain form expects any failure; the table form pins match/raises; mistakes are usage errors."""
    from pytest_zero3 import expectations

    path = tmp_path / "e.toml"
    path.write_text(
        '[expected_failures]\n"001-a" = "any failure"\n'
        '"001-b" = { reason = "a cause", match = "held by FWD_\\\\w+", raises = "AssertionError" }\n'
    )
    table = expectations.load(path)
    assert table["001-a"] == expectations.Expectation("any failure") and table["001-a"].cause == ""
    assert table["001-a"].matches(RuntimeError("anything"))
    assert table["001-b"].matches(AssertionError("engine held by FWD_MODULE_STACK"))
    assert not table["001-b"].matches(AssertionError("engine held by an lru_cache"))
    assert not table["001-b"].matches(RuntimeError("engine held by FWD_MODULE_STACK"))
    for body, error in (
        ('"001-a" = { reason = "r", match = "(" }', "no regular expression"),
        ('"001-a" = { reason = "r", cause = "x" }', "unknown keys cause"),
        ('"001-a" = { match = "x" }', "non-empty reason"),
        ('"001-a" = 3', "a reason string or a table"),
        ('"001-a" = { reason = "r", profiles = "hpz" }', "profiles must be a non-empty list"),
        ('"001-a" = { reason = "r", profiles = ["hpz", "nope"] }', "unknown profiles nope; choose from fp32"),
        ('"001-a" = { reason = "r", when = ["bf16.enabled"] }', "when must be a table of dotted config keys"),
        ('"001-a" = { reason = "r", when = { "bf16" = { enabled = true } } }', "when must be a table of dotted"),
    ):
        path.write_text(f"[expected_failures]\n{body}\n")
        with pytest.raises(pytest.UsageError, match=error):
            expectations.load(path)


def test_an_entry_with_profiles_lists_those_profiles_tests_only(run_pytest, tmp_path):
    """A failure only a profile's axis reaches is expected there; the contract's other tests stay unlisted
    (an entry for every profile would make them unexpected passes, and hide a new failure under them)."""
    expect = tmp_path / "expect.toml"
    case = str(ROOT / "tests" / "data" / "profile_case.py")
    entry = '"900-a" = { reason = "hpz breaks it", match = "the hpz axis", profiles = ["hpz"] }'
    expect.write_text(f"[expected_failures]\n{entry}\n")
    run = run_pytest(case, f"--zero3-expect={expect}", "--zero3-strict", "-rxX")
    assert run.returncode == 0 and run.outcomes() == {"900-a": "known_failure"}, run.stdout
    assert "XPASS" not in run.stdout, run.stdout  # the fp32 test is not listed: a plain pass
    assert "XFAIL tests/data/profile_case.py::test_per_profile[hpz] - known failure 900-a" in run.stdout
    zinit = entry.replace('["hpz"]', '["zinit"]')  # the failure under hpz is then no listed one
    expect.write_text(f"[expected_failures]\n{zinit}\n")
    run = run_pytest(case, f"--zero3-expect={expect}")
    assert run.returncode == 1 and run.outcomes() == {"900-a": "fail"}, run.stdout


def test_an_entry_with_when_lists_the_tests_whose_config_has_those_values(run_pytest, tmp_path):
    """Why (issue 38, drawn fork configs): a bug a config key reaches is known wherever the suite's config
    has that key, under a profile or under a fork's --zero3-config alike; elsewhere the test is unlisted."""
    expect = tmp_path / "expect.toml"
    case = str(ROOT / "tests" / "data" / "profile_case.py")
    entry = '"900-a" = { reason = "hpz breaks it", match = "the hpz axis", when = { "zero_optimization.zero_hpz_partition_size" = 2 } }'
    expect.write_text(f"[expected_failures]\n{entry}\n")
    run = run_pytest(case, f"--zero3-expect={expect}", "--zero3-strict", "-rxX")
    assert run.returncode == 0 and run.outcomes() == {"900-a": "known_failure"}, run.stdout
    assert "XPASS" not in run.stdout, run.stdout  # fp32's config has no hpZ: not listed
    assert "XFAIL tests/data/profile_case.py::test_per_profile[hpz] - known failure 900-a" in run.stdout
    overlay = tmp_path / "fork.json"  # a fork's config with hpZ: its fp32 test is listed too (and passes here)
    overlay.write_text('{"zero_optimization": {"zero_hpz_partition_size": 2}}')
    run = run_pytest(case, f"--zero3-expect={expect}", f"--zero3-config={overlay}", "-rxX")
    assert "XPASS tests/data/profile_case.py::test_per_profile[fp32] - known failure 900-a" in run.stdout, run.stdout


def test_an_array_entry_holds_each_variant_to_its_own_cause(run_pytest, tmp_path):
    """Why (issue 39, no shadowing): two variants of one contract failing for two bugs are each pinned to
    their own; a variant that fails with the other's cause is a new failure, not a known one."""
    expect = tmp_path / "expect.toml"
    case = str(ROOT / "tests" / "data" / "variant_case.py")
    first = '{ reason = "bug one", match = "the first bug", variants = ["a"] }'
    second = '{ reason = "bug two", match = "the second bug", variants = ["b"] }'
    expect.write_text(f'[expected_failures]\n"900-a" = [{first}, {second}]\n')
    run = run_pytest(case, f"--zero3-expect={expect}", "-rxX")
    assert run.returncode == 0 and run.outcomes() == {"900-a": "known_failure"}, run.stdout
    assert "XFAIL tests/data/variant_case.py::test_per_variant[b] - known failure 900-a: bug two" in run.stdout
    crossed = second.replace("the second bug", "the first bug")  # b's real cause is then unlisted
    expect.write_text(f'[expected_failures]\n"900-a" = [{first}, {crossed}]\n')
    run = run_pytest(case, f"--zero3-expect={expect}")
    assert run.returncode == 1 and run.outcomes() == {"900-a": "fail"}, run.stdout
    for body, error in (
        (f'[{first}, {{ reason = "r", match = "x" }}]', "give each its variants = \\[...\\], profiles"),
        (f"[{first}, {first}]", "lists variant 'a' twice"),
    ):
        expect.write_text(f'[expected_failures]\n"900-a" = {body}\n')
        with pytest.raises(pytest.UsageError, match=error):
            from pytest_zero3 import expectations

            expectations.load(expect)


def test_an_array_entry_may_list_by_profile_and_by_config_and_holds_a_test_both_list_to_both(run_pytest, tmp_path):
    """Why (the proof run's draws): 007-e fails under the hpz profile for one bug and under a torch_autocast
    config with the all-reduce fetch for another; one table per contract could list only one of them.
    Tables of the array form may name their tests by profiles or when; a test two of them list is held
    to both causes, each problem to one of them, and one neither explains fails."""
    from pytest_zero3 import expectations

    expect = tmp_path / "expect.toml"
    case = str(ROOT / "tests" / "data" / "profile_case.py")
    overlay = tmp_path / "fork.json"
    overlay.write_text('{"zero_optimization": {"zero_hpz_partition_size": 2}}')
    by_profile = '{ reason = "the profile bug", match = "the hpz axis", profiles = ["hpz"] }'
    by_config = '{ reason = "the config bug", match = "a config key", when = { "zero_optimization.zero_hpz_partition_size" = 2 } }'
    expect.write_text(f'[expected_failures]\n"900-a" = [{by_profile}, {by_config}]\n')
    listed = expectations.load(expect)["900-a"]
    both = listed.listing("hpz", None, lambda: {"zero_optimization.zero_hpz_partition_size": 2})
    assert both is not None and both.patterns == ("the hpz axis", "a config key"), both
    assert listed.listing("fp32", None, lambda: {}) is None
    run = run_pytest(case, f"--zero3-expect={expect}", f"--zero3-config={overlay}", "-rxX")
    assert run.returncode == 0 and run.outcomes() == {"900-a": "known_failure"}, run.stdout
    assert "XFAIL tests/data/profile_case.py::test_per_profile[hpz] - known failure 900-a" in run.stdout
    elsewhere = by_profile.replace("the hpz axis", "another axis")  # the failure's cause is then neither's
    expect.write_text(f'[expected_failures]\n"900-a" = [{elsewhere}, {by_config}]\n')
    run = run_pytest(case, f"--zero3-expect={expect}", f"--zero3-config={overlay}")
    assert run.returncode == 1 and run.outcomes() == {"900-a": "fail"}, run.stdout


def test_shipped_expectations_pin_a_cause_for_every_measured_failure():
    """Every entry of every release's file pins its cause, and the cause matches the failure message
    docs/release-matrix.md records for that release (000-f of 0.19.2 never ran here: no libaio)."""
    from pytest_zero3.fixtures.rule.rules import RELAXATIONS

    from pytest_zero3 import expectations

    text = (ROOT / "docs" / "release-matrix.md").read_text()
    messages = {}
    for section in re.split(r"^## deepspeed ", text, flags=re.M)[1:]:
        release = section.split("\n", 1)[0]
        for m in re.finditer(r"\*\*[\d.]+ · `([^`]+)` FAIL\*\*(.*?)```\n(.*?)```", section, re.S):
            # a failure the file explained (a FAIL it did not has no cause yet); a rank's death keeps its
            # cause in the rank's output, which the page does not show
            if "Known failure:" in m.group(2) and not re.match(r"rank \d+ died", m.group(3)):
                messages[release, m.group(1)] = m.group(3)
    for path in sorted((ROOT / "conformance" / "expectations").glob("deepspeed-*.toml")):
        release = path.stem.split("-", 1)[1]
        for cid, exp in expectations.load(path).items():
            assert all(e.cause for e in exp.entries()), f"{path.name}: {cid} pins no cause"
            pins = [p for e in exp.entries() for p in e.patterns]
            # a pin naming one of the rule model's relaxations matches what the model marks ("[legal under:
            # NAME]"), which the page's messages predate: it must name a relaxation the model has
            relaxed = [p for p in pins if "legal under" in p]
            assert all(any(name in p for name in RELAXATIONS) for p in relaxed), f"{path.name}: {cid}: {relaxed}"
            pins = [p for p in pins if p not in relaxed]
            if (release, cid) in messages and pins:  # the page keeps one message: one variant's cause in it
                assert any(re.search(m, messages[release, cid]) for m in pins), (
                    f"{path.name}: {cid}'s match misses its message"
                )


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
    assert "conformance/test_contracts.py::test_contract[base-a]" in out.stdout


def test_unwritable_report_path_is_a_usage_error_before_any_world(run_pytest):
    for option in ("--zero3-report=/proc/zero3/x.json", "--zero3-report-md=/proc/x.md"):
        run = run_pytest(CASE, option)
        assert run.returncode == 4, run.stdout
        assert f"{option}: cannot write there" in run.stdout and "give a writable path" in run.stdout
        assert "ZeRO-3 conformance" not in run.stdout and "Traceback" not in run.stdout


SABOTAGE = """
import os

import pytest


@pytest.mark.zero3_contract("900-a", "the report's directory becomes a file")
def test_sabotage(request):
    folder = os.path.dirname(request.config.getoption("--zero3-report"))
    os.rmdir(folder)
    open(folder, "w").close()
"""


def test_a_failed_report_write_comes_after_the_table_in_one_line(run_pytest, tmp_path):
    test = tmp_path / "test_sabotage.py"
    test.write_text(SABOTAGE)
    path = tmp_path / "out" / "r.json"
    run = run_pytest(str(test), f"--zero3-report={path}")
    out = run.stdout
    assert "Traceback" not in out and "PluggyTeardownRaisedWarning" not in out, out
    line = f"--zero3-report={path}: the report could not be written (Not a directory)"
    assert out.index("900-a") < out.index("contracts: 1 pass") < out.index(line), out


@pytest.mark.slow  # a suite run of 30-150 s on the loaded 2-core machine
def test_a_coordinator_that_never_completes_a_trace_fails_naming_rule_g(run_suite):
    """Why: "unsupported" is for a missing feature; a coordinator that never completes a trace is broken."""
    run = run_suite(f"{ROOT / 'tests' / 'data' / 'never_complete_trace.py'}:NeverCompleteTrace", "001-a,001-d")
    assert run.returncode == 1 and run.outcomes() == {"001-a": "fail", "001-d": "fail"}, run.stdout[-3000:]
    for row in run.report["contracts"]:
        assert f"{row['id']}'s precondition is broken: the coordinator never reported a complete trace" in row["reason"]
        assert "rule-g judges that precondition" in row["message"], row


STOCK = ("installed", "001-a", f"--zero3-expect={ROOT / 'conformance' / 'expectations' / 'deepspeed-0.19.8.toml'}")


def test_stock_known_failure_is_xfail_in_junit_and_a_failure_under_runxfail(run_suite, tmp_path):
    stock = ("installed", "000-a", STOCK[2])  # listed for 0.19.8, and cheaper than 001-a's ten engines
    junit = tmp_path / "junit.xml"
    run = run_suite(*stock, f"--junitxml={junit}")
    assert run.returncode == 0 and run.outcomes() == {"000-a": "known_failure"}, run.stdout[-3000:]
    assert set(_junit(junit).values()) == {"skipped"}  # an xfail, not a pass
    run = run_suite(*stock, "--runxfail")
    assert run.returncode == 1 and run.outcomes() == {"000-a": "fail"}, run.stdout[-3000:]
    assert "known failure 000-a:" in run.stdout and "PR 9003" in run.stdout


@pytest.mark.slow  # a suite run of 30-150 s on the loaded 2-core machine
def test_a_second_leak_behind_a_listed_contract_fails_the_gate(run_suite):
    """Why (issue 25): 0.19.8 lists 001-a for its FWD_MODULE_STACK leak; an implementation that leaks
    for another reason (here a class-level cache on the coordinator) must not pass as that known failure."""
    coordinator = BAD / "class_level_cache.py"
    run = run_suite(f"{coordinator}:ClassLevelCacheCoordinator", *STOCK[1:])
    assert run.returncode == 1 and run.outcomes() == {"001-a": "fail"}, run.stdout[-3000:]
    reason = run.report["contracts"][0]["reason"]
    assert "failed for another cause than --zero3-expect lists" in reason or "behind its known failure" in reason, (
        reason
    )


PARAMETRISED = """
import pytest


@pytest.mark.zero3_contract("900-a", "both cases hold")
@pytest.mark.parametrize("case", ["first", "second"])
def test_cases(case):
    assert case not in {FAILING}, f"{case} does not hold"
"""


def test_strict_judges_a_contract_of_several_tests_as_a_whole(run_pytest, tmp_path):
    """Why: 000-d on stock fails with prefetch on and passes with it off; the contract is listed as a
    whole, so one passing case is no unexpected pass, while every case passing is (no worlds here)."""
    expect = tmp_path / "expect.toml"
    expect.write_text('[expected_failures]\n"900-a" = { reason = "first case", raises = "AssertionError" }\n')
    for failing, code, outcome in (('"first"', 0, "known_failure"), ("", 1, "unexpected_pass")):
        test = tmp_path / f"test_param_{code}.py"
        test.write_text(PARAMETRISED.replace("{FAILING}", f"{{{failing}}}" if failing else "set()"))
        run = run_pytest(str(test), f"--zero3-expect={expect}", "--zero3-strict")
        assert run.returncode == code and run.outcomes() == {"900-a": outcome}, run.stdout
    assert "every test of contract 900-a passed, but --zero3-expect lists it as failing" in run.stdout
    assert "1 error" in run.stdout  # pytest's own: the last test's teardown
