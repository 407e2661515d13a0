"""Each --zero3-impl form reaches every rank (issue: foundation §2 and §4)."""

import os
import re

from conftest import ROOT

CASE = str(ROOT / "tests" / "data" / "identity_case.py")


def identity(run):
    assert run.returncode == 0, run.stdout
    match = re.search(r"IDENTITY (\S+) (\S+)", run.stdout)
    return match.group(1), match.group(2)


def test_installed(run_pytest):
    import importlib.util

    path, cls = identity(run_pytest(CASE, "-s"))
    assert path == os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    assert cls == "deepspeed.runtime.zero.partitioned_param_coordinator.PartitionedParameterCoordinator"


def test_reference(run_pytest):
    _, cls = identity(run_pytest(CASE, "-s", "--zero3-impl=reference"))
    assert cls == "pytest_zero3.reference_impl.coordinator.ReferenceCoordinator"


def test_fork_directory_is_imported_by_every_rank(run_pytest, fork_without_checkpoint_fix):
    fork = fork_without_checkpoint_fix
    run = run_pytest(CASE, "-s", f"--zero3-impl={fork}")
    path, _ = identity(run)
    assert path == os.path.join(fork, "deepspeed")
    assert f"from {os.path.join(fork, 'deepspeed')}" in run.stdout  # the header names the fork


def test_file_and_module_class_forms(run_pytest):
    data = ROOT / "tests" / "data"
    _, cls = identity(run_pytest(CASE, "-s", f"--zero3-impl={data / 'coordinator_subclass.py'}:RenamedCoordinator"))
    assert cls.endswith("coordinator_subclass.RenamedCoordinator")
    _, cls = identity(
        run_pytest(CASE, "-s", "--zero3-impl=coordinator_subclass:RenamedCoordinator", env={"PYTHONPATH": str(data)})
    )
    assert cls == "coordinator_subclass.RenamedCoordinator"


def test_a_class_module_that_patches_deepspeed_does_not_leak_into_later_sessions(run_pytest):
    """Why: the forkserver imports a ``class`` spec's module, and bad coordinators here call
    ``reference_impl.install()`` at import; a later session on the installed deepspeed that reused that
    warm forkserver ran the reference in its ranks (stock looked fixed: an unexpected pass in CI)."""
    bad = ROOT / "tests" / "bad_coordinators" / "grows_fetch_log.py"
    _, cls = identity(run_pytest(CASE, "-s", f"--zero3-impl={bad}:GrowsFetchLog"))
    assert cls.endswith("GrowsFetchLog")
    _, cls = identity(run_pytest(CASE, "-s"))
    assert cls == "deepspeed.runtime.zero.partitioned_param_coordinator.PartitionedParameterCoordinator"
