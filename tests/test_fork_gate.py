"""The CI gate for a DeepSpeed fork: fails on the broken contract, goes green once it is expected (issue 8)."""

import os

import pytest
from forks import KNOWN_BADS

from conftest import ROOT


def test_fork_with_a_bug_brought_back_fails_on_its_contract_then_passes_with_expectations(
    run_suite, fork_without_checkpoint_fix, tmp_path
):
    fork = fork_without_checkpoint_fix
    run = run_suite(fork, "002-a")
    assert run.returncode == 1, run.stdout
    assert run.outcomes() == {"002-a": "fail"}
    assert f"from {os.path.join(fork, 'deepspeed')}" in run.stdout  # header names the fork
    assert run.report["implementation"]["deepspeed_path"] == os.path.join(fork, "deepspeed")
    assert run.report["implementation"]["spec"] == fork
    row = run.report["contracts"][0]
    assert any("CheckpointError" in r["message"] or "CheckpointError" in r["traceback"] for r in row["ranks"])

    expect = tmp_path / "expect.toml"
    expect.write_text(
        "# this fork has not picked up the 0.19.3 checkpoint fix yet\n"
        '[expected_failures]\n"002-a" = "frozen params partitioned during recompute"\n'
    )
    run = run_suite(fork, "002-a", f"--zero3-expect={expect}")
    assert run.returncode == 0, run.stdout
    assert run.outcomes() == {"002-a": "known_failure"}
    assert "known failure" in run.stdout


def test_shipped_stock_expectations_file_is_valid_and_lists_reasons():
    from pytest_zero3 import expectations

    table = expectations.load(ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml")
    assert "000-a" in table and "001-a" in table and all(table.values())
    # Every release of the release matrix (scripts/release-matrix.sh) ships a loadable file.
    for release in ("0.14.5", "0.15.4", "0.16.9", "0.17.6", "0.18.9", "0.19.2", "0.19.3"):
        table = expectations.load(ROOT / "conformance" / "expectations" / f"deepspeed-{release}.toml")
        assert "001-a" in table and all(table.values()), release


def test_a_fork_that_adds_a_second_leak_fails_although_its_base_lists_the_first(run_suite, tmp_path):
    """Why (issue 25): stock 0.19.8 fails 001-a (FWD_MODULE_STACK keeps modules alive), and its
    expectations file lists that; a fork of 0.19.8 that also keeps every coordinator in a registry of
    its own leaks for another cause, and its gate must go red, not report the known failure."""
    from forks import copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    relpath = "runtime/zero/partitioned_param_coordinator.py"
    edit(
        fork,
        relpath,
        "class PartitionedParameterCoordinator:",
        "_SEEN = []\n\n\nclass PartitionedParameterCoordinator:",
    )
    edit(
        fork,
        relpath,
        "        # mapping of param -> handle for each param that is currently in flight\n",
        "        _SEEN.append(self)  # a debugging registry, never cleared\n"
        "        # mapping of param -> handle for each param that is currently in flight\n",
    )
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    run = run_suite(fork, "001-a", f"--zero3-expect={expect}")
    assert run.returncode == 1 and run.outcomes() == {"001-a": "fail"}, run.stdout[-4000:]
    reason = run.report["contracts"][0]["reason"]
    assert "failed for another cause than --zero3-expect lists" in reason or "behind its known failure" in reason, (
        reason
    )


@pytest.mark.proof  # an offloaded world with DeepSpeedCPUAdam on a fork: 44 s quiet (scripts/proofs.sh)
def test_a_second_bug_behind_a_listed_failure_of_the_same_test_fails_the_gate(run_suite, tmp_path):
    """Why (issue 53): stock 0.19.8 fails 008-b's offload variant (bug 10, listed with its fallout, and
    bug 21); a fork of it whose safe_set_local_grad leaves the global norm stale must go red naming the
    stale norm, not read as the known failure.  (Stock with its file is a known failure there: the main
    job, scripts/conformance.sh, runs it; a second world here would cost CI 25 s.)"""
    from forks import BREAK_LOCAL_GRAD_NORM, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    edit(fork, *BREAK_LOCAL_GRAD_NORM)
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    only = ("-k", "008-b-offload")
    run = run_suite(fork, "008-b", f"--zero3-expect={expect}", *only)
    assert run.returncode == 1 and run.outcomes() == {"008-b": "fail"}, run.stdout[-4000:]
    reason = run.report["contracts"][0]["reason"]
    assert "behind its known failure" in reason and "after step 1: engine.get_global_grad_norm()" in reason, reason


def test_a_crash_inside_the_implementation_is_no_refusal(run_suite, tmp_path):
    """Why (issue 53): 008-e accepts a deepcopy of the wrapped model refused at the call; a fork of
    0.19.8 whose deepcopy crashes from inside DeepSpeed (a TypeError naming no copy) read as such a
    refusal, an unexpected pass of 0.19.8's listed bug, and the gate stayed green.  It fails now."""
    from forks import BREAK_DEEPCOPY_CRASH, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    for change in BREAK_DEEPCOPY_CRASH:
        edit(fork, *change)
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    run = run_suite(fork, "008-e", f"--zero3-expect={expect}", "-k", "deepcopy")
    assert run.returncode == 1 and run.outcomes() == {"008-e": "fail"}, run.stdout[-4000:]
    assert "a crash inside the implementation, not a refusal" in run.stdout, run.stdout[-4000:]


#: The listed contracts of 0.19.8 whose tests the backward-release fork (BREAK_BACKWARD_RELEASE) reaches
#: behind their known failures, measured (its other failures are of contracts 0.19.8 passes).
BEHIND_BACKWARD_RELEASE = ("005-c", "005-f", "007-a", "rule-b", "rule-f", "zoo-a", "zoo-b", "zoo-c", "zoo-d", "zoo-e")


@pytest.mark.proof  # the contracts' worlds on a fork, twice in baseline mode: minutes (scripts/proofs.sh)
@pytest.mark.parametrize("mode", ["expect", "baseline"])
def test_a_second_release_bug_behind_known_failures_fails_the_gate(run_suite, tmp_path, mode):
    """Why (issue 53): 0.19.8's entries once matched a line any new release bug also prints (rule-b's
    "is AVAILABLE; must be partitioned", the zoo's summary), so a new release bug of a fork of 0.19.8
    read as the known PR 9003 retention.  The rule family's and the zoo's entries now explain only
    violations the rule model finds legal under 0.19.8's known behaviours (executable relaxations), the
    others only the problems they name.  A fork whose post-backward hooks stop releasing must go red on
    every listed contract it reaches, with 0.19.8's file and against the installed 0.19.8 as baseline."""
    from forks import BREAK_BACKWARD_RELEASE, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    edit(fork, *BREAK_BACKWARD_RELEASE)
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    option = f"--zero3-expect={expect}" if mode == "expect" else "--zero3-baseline=installed"
    run = run_suite(
        fork, ",".join(BEHIND_BACKWARD_RELEASE), option, "--zero3-examples=0", "--zero3-shrink=0", "-n", "2"
    )
    assert run.returncode == 1, run.stdout[-4000:]
    rows = {c["id"]: c for c in run.report["contracts"]}
    assert {cid: rows[cid]["outcome"] for cid in BEHIND_BACKWARD_RELEASE} == dict.fromkeys(
        BEHIND_BACKWARD_RELEASE, "fail"
    ), run.stdout[-4000:]
    for cid in BEHIND_BACKWARD_RELEASE:
        if mode == "expect":
            assert "behind its known failure" in rows[cid]["reason"], (cid, rows[cid]["reason"])
        else:
            assert rows[cid]["verdict"] == "regression", (cid, rows[cid]["verdict"], rows[cid]["reason"])


#: The known-bads cheap enough for every CI run with 0.19.8's file (a few seconds each, measured); the
#: rest, and every one against the installed 0.19.8 as baseline (a second suite run), are proofs.
CHEAP_KNOWN_BADS = ("reuse_scan_start", "persistent_release", "gathered_depth", "ipg_exact_fit", "post_step_regather")


@pytest.mark.parametrize(
    "mode, name",
    [
        pytest.param(
            mode,
            name,
            id=f"{name}-{mode}",
            marks=() if (mode == "expect" and name in CHEAP_KNOWN_BADS) else pytest.mark.proof,
        )
        for name in KNOWN_BADS
        for mode in ("expect", "baseline")
    ],
)
def test_a_second_bug_behind_each_known_failure_fails_the_gate(run_suite, tmp_path, mode, name):
    """Why (issue 53, item 7): each entry of 0.19.8's file must explain its own bug only.  Each known-bad
    of tests/forks.py KNOWN_BADS is 0.19.8 with a second bug that the listed tests reach; each of those
    contracts must fail, with 0.19.8's file and against the installed 0.19.8 as baseline."""
    from forks import copy_installed_deepspeed, edit

    change, contracts, extra = KNOWN_BADS[name]
    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    edit(fork, *change)
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    option = f"--zero3-expect={expect}" if mode == "expect" else "--zero3-baseline=installed"
    run = run_suite(fork, ",".join(contracts), option, "--zero3-examples=0", "--zero3-shrink=0", *extra)
    assert run.returncode == 1, run.stdout[-4000:]
    rows = {c["id"]: c for c in run.report["contracts"]}
    assert {cid: rows[cid]["outcome"] for cid in contracts} == dict.fromkeys(contracts, "fail"), run.stdout[-4000:]
    if mode == "baseline":
        for cid in contracts:
            assert rows[cid]["verdict"] == "regression", (cid, rows[cid]["verdict"], rows[cid]["reason"])
