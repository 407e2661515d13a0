"""Each --zero3-impl form reaches every rank (issue: foundation §2 and §4)."""

import os
import re

from conftest import ROOT
from pytest_zero3 import spawner

CASE = str(ROOT / "tests" / "data" / "identity_case.py")


def identity(run):
    assert run.returncode == 0, run.stdout
    match = re.search(r"IDENTITY (\S+) (\S+)", run.stdout)
    return match.group(1), match.group(2)


def test_installed_even_after_a_class_whose_module_patches_deepspeed(run_pytest):
    """Why: bad coordinators here call ``reference_impl.install()`` at import.  When the forkserver
    imported a ``class`` spec's module, a later session on the installed deepspeed that reused that warm
    forkserver ran the reference in its ranks (stock looked fixed: an unexpected pass in CI)."""
    import importlib.util

    bad = ROOT / "tests" / "bad_coordinators" / "grows_fetch_log.py"
    _, cls = identity(run_pytest(CASE, "-s", f"--zero3-impl={bad}:GrowsFetchLog"))
    assert cls.endswith("GrowsFetchLog")
    path, cls = identity(run_pytest(CASE, "-s"))
    assert path == os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    assert cls == "deepspeed.runtime.zero.partitioned_param_coordinator.PartitionedParameterCoordinator"


def test_reference(run_pytest):
    _, cls = identity(run_pytest(CASE, "-s", "--zero3-impl=reference"))
    assert cls == "pytest_zero3.reference_impl.coordinator.ReferenceCoordinator"


def _forkserver_pids() -> dict:
    """``{deepspeed import path: pid}`` of the forkservers this process keeps warm (spawner.held)."""
    return {entry.fits[0]: entry.server._forkserver_pid for entry in spawner._servers}


def test_fork_directory_is_imported_by_every_rank(run_pytest, fork_without_checkpoint_fix):
    """A fork's session between two on the installed deepspeed: each rank imports the session's own
    deepspeed, and the installed one's forkserver stays warm through the fork's session (a restart
    at every switch costs about 8 s of imports); both are forked from one zygote holding torch."""
    import importlib.util

    installed = os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    fork = fork_without_checkpoint_fix
    assert identity(run_pytest(CASE, "-s"))[0] == installed
    key = spawner._servers[0].fits[0]  # the installed deepspeed's forkserver, the one just used
    before = _forkserver_pids()
    run = run_pytest(CASE, "-s", f"--zero3-impl={fork}")
    path, _ = identity(run)
    assert path == os.path.join(fork, "deepspeed")
    assert f"from {os.path.join(fork, 'deepspeed')}" in run.stdout  # the header names the fork
    fork_key = spawner._servers[0].fits[0]
    assert identity(run_pytest(CASE, "-s"))[0] == installed
    after = _forkserver_pids()
    assert before[key] is not None and after[key] == before[key], (before, after)
    assert after[fork_key] is not None  # and the fork's own, warm for its next session
    # both forked from one zygote, which imported torch once for the two (pytest_zero3/zygote.py)
    parents = {_parent(after[key]), _parent(after[fork_key])}
    assert len(parents) == 1 and parents != {os.getpid()}, (parents, os.getpid())
    assert _parent(parents.pop()) == os.getpid()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[1])


def test_file_and_module_class_forms(run_pytest):
    data = ROOT / "tests" / "data"
    _, cls = identity(run_pytest(CASE, "-s", f"--zero3-impl={data / 'coordinator_subclass.py'}:RenamedCoordinator"))
    assert cls.endswith("coordinator_subclass.RenamedCoordinator")
    # importable from the path pytest's own ``pythonpath`` setting adds (the parent, the forkserver and
    # the ranks share the parent's sys.path)
    _, cls = identity(
        run_pytest(CASE, "-s", "--zero3-impl=coordinator_subclass:RenamedCoordinator", "-o", f"pythonpath={data}")
    )
    assert cls == "coordinator_subclass.RenamedCoordinator"
