"""Launcher mode across nodes (issue 33): two ``torchrun --nnodes 2 --node_rank i --nproc_per_node 2``
launches on this host, joined by a c10d rendezvous, stand for two nodes of two ranks.

One pair of launches runs tests/data/torchrun_nodes_case.py: a scenario that node 1's pytest never
reaches is a world error naming its ranks and node, within the scenario's timeout; the 4-rank world
ran every other contract, global rank 0 alone prints the table and writes the report, and they say
the world that ran (4 ranks, torchrun's WORLD_SIZE, not the option's default of 2); hpz keeps one
node's ranks as its secondary partition; a bug on rank 3 fails both launches and is named.  A third
launch, whose other node never comes, ends at the rendezvous's join timeout, not in a hang.  And
rank 0 does not wait at its session's end for ranks that never joined a world (no torchrun).
"""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "data" / "torchrun_nodes_case.py"
#: Seconds the launch of a node whose peer never comes waits for it (torchrun's join_timeout).
JOIN_TIMEOUT = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path, node: int, port: int, *args, join_timeout: float = 120):
    """One node's launch: ``torchrun --nnodes 2 --node_rank NODE --nproc_per_node 2`` of a pytest."""
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    log = open(tmp_path / f"node{node}.log", "w+")
    command = [
        "torchrun",
        "--nnodes=2",
        f"--node_rank={node}",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_conf=join_timeout={join_timeout}",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *map(str, args),
    ]
    return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT), log


def _finish(launch, timeout: float) -> tuple[int, str]:
    proc, log = launch
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        proc.kill()
    log.seek(0)
    return rc, log.read()


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
@pytest.mark.slow  # four pytest processes under three torchruns: about 48 s of CPU, 30 s on 2 idle cores
def test_two_nodes_one_table_of_the_world_that_ran_a_bug_on_rank_three_named_and_a_node_that_never_joins(tmp_path):
    """Both launches fail on the bug, rank 3 named in every rank's output and in global rank 0's one
    table, which says the world that ran.  Beside them (at the same time: its wait overlaps theirs), a
    third launch whose other node never comes: no pytest starts before every node joined (torchrun's
    rendezvous forms the world first), so the launch reports it itself and ends at its join timeout,
    with the rendezvous's error, instead of waiting forever."""
    report = tmp_path / "r.json"
    port = _free_port()
    args = (CASE, f"--zero3-report={report}", "--zero3-timeout=120")
    launches = [_launch(tmp_path, node, port, *args) for node in (0, 1)]
    alone_dir = tmp_path / "alone"
    alone_dir.mkdir()
    start = time.monotonic()
    other_port = next(p for p in iter(_free_port, None) if p != port)
    alone = _launch(alone_dir, 0, other_port, CASE, join_timeout=JOIN_TIMEOUT)
    rc, out = _finish(alone, 120)
    took = time.monotonic() - start
    assert rc != 0 and "RendezvousTimeoutError" in out, out
    assert "test session starts" not in out, out
    assert took < JOIN_TIMEOUT + 30, (took, out)

    (rc0, out0), (rc1, out1) = [_finish(launch, 400) for launch in launches]
    assert rc0 != 0 and rc1 != 0, out0 + out1  # the bug fails both launches
    for out in (out0, out1):  # every rank saw every rank's outcome
        assert "rank 3: raised: ValueError: a bug on the other node" in out, out
    # node 0's ranks saw node 1's never come to 996-0 (a world error), node 1's ranks skipped it
    (table,) = [out for out in (out0, out1) if "ZeRO-3 conformance" in out]
    other = out1 if table is out0 else out0
    assert table.count("2 failed, 2 passed") == 2 and other.count("1 failed, 3 passed") == 2, out0 + out1
    # one table, global rank 0's, of the world that ran; the c10d rendezvous orders the nodes itself (by
    # host and pid, not --node_rank), so either launch may hold global rank 0
    assert table.count("ZeRO-3 conformance") == 1, table
    assert "zero3: backend=auto, world size=4," in table, table
    assert "accelerator cpu; backend gloo; world size 4" in table, table
    doc = json.loads(report.read_text())
    assert doc["implementation"]["world_size"] == 4, doc["implementation"]
    rows = {c["id"]: c for c in doc["contracts"]}
    assert {cid: row["outcome"] for cid, row in rows.items()} == {
        "996-0": "world_error",
        "996-a": "pass",
        "996-b": "pass",
        "996-c": "fail",
    }
    assert "ranks 2, 3 (node 1) never joined a world in this session" in rows["996-0"]["message"], rows["996-0"]
    assert "rank 3: unformed: never joined a world in this session" in table, table
    # its 5 s timeout (no exchange grace: nobody waits for ranks that never joined), and the launch's
    # first world (imports, on 2 busy cores)
    assert rows["996-0"]["duration"] < 5 + 15, rows["996-0"]
    assert "rank 3 raised: ValueError: a bug on the other node" in rows["996-c"]["message"], rows["996-c"]
    assert [r["status"] for r in rows["996-c"]["ranks"]] == ["passed", "passed", "passed", "raised"], rows["996-c"]


class _Store:
    """The launcher's key-value store, as far as the end of a session uses it: keys set, none awaited."""

    def __init__(self, keys):
        self.keys = dict.fromkeys(keys, b"0")

    def set(self, key, value):
        self.keys[key] = str(value).encode()

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]

    def wait(self, keys, timeout):
        if not self.check(keys):
            raise AssertionError(f"waited for {keys}, which never come")


def test_rank_zero_does_not_wait_at_session_end_for_ranks_that_never_joined(monkeypatch):
    """Ranks 2 and 3 (node 1) reached no world: rank 0 reports at once, naming them, instead of waiting
    SESSION_WAIT for their statuses (and a rank that did join and ended is read as before)."""
    from pytest_zero3 import launcher

    store = _Store([f"{launcher.PRESENT_PREFIX}/{r}" for r in (0, 1)] + [f"{launcher.SESSION_PREFIX}/status/1"])
    monkeypatch.setattr(launcher, "_store", store)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    end = launcher.SessionEnd()
    end.pytest_sessionfinish(session=None, exitstatus=1)
    assert (end.absent, end.statuses) == ([2, 3], {1: "0"})
    lines = []
    end.pytest_terminal_summary(SimpleNamespace(write_line=lambda line, **kw: lines.append(line)))
    assert lines == ["zero3: ranks 2, 3 (node 1) never joined a world in this session; see their own output"]
