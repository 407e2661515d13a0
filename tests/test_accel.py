"""Any DeepSpeed accelerator (issue 33): the device, the backend and the device-side tools come from
DeepSpeed's accelerator through one adapter, :mod:`pytest_zero3.accel`.

Cheap checks (no world): nothing outside the adapter names CUDA or NCCL in code, the backend option
takes any torch.distributed backend's form, and the session's DS_ACCELERATOR is the user's where set.
Two one-contract sessions show the CPU accelerator through the adapter: with DS_ACCELERATOR=cpu (in
this process) and with it unset (DeepSpeed detects the CPU; a pytest of its own).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_zero3 import accel, options

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
#: The code that runs the contracts: the plugin, the suite's fixtures and contracts, the reference.
SCANNED = ("pytest_zero3", "fixtures", "conformance", "reference_impl")
ADAPTER = ROOT / "pytest_zero3" / "accel.py"
NAMES = ("cuda", "nccl")


def bypasses(source: str) -> list[str]:
    """Where ``source`` names CUDA or NCCL in code: an attribute or import named ``cuda``, or a string
    that is (or starts) a device or backend name.  Prose (comments, docstrings) is not code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.alias) and set(node.name.split(".")) & set(NAMES):
            found.append(f"line {node.lineno}: import {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.strip().lower()
            if word in NAMES or word.startswith(tuple(f"{n}:" for n in NAMES)):
                found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_scan_sees_each_way_code_names_cuda():
    assert bypasses("torch.cuda.set_device(0)") == ["line 1: .cuda"]
    assert bypasses("from torch import cuda") == ["line 1: import cuda"]
    assert bypasses("b = 'nccl'\nd = torch.device('cuda:0')") == ["line 1: 'nccl'", "line 2: 'cuda:0'"]
    assert bypasses('"""Runs on CUDA with NCCL."""\n# torch.cuda in a comment') == []


def test_nothing_outside_the_adapter_names_cuda_or_nccl():
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py")) if p != ADAPTER]
    assert len(files) > 50, files  # the scan reads the sources
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := bypasses(p.read_text()))}
    assert found == {}, f"go through pytest_zero3/accel.py instead: {found}"
    assert bypasses(ADAPTER.read_text()), "the adapter is the one place that names them"


@pytest.mark.parametrize("name", ["auto", "gloo", "nccl", "ccl", "xccl", "hccl", "mpi", "cpu:gloo,cuda:nccl"])
def test_any_torch_distributed_backend_is_accepted(name):
    (opt,) = [o for o in options.OPTIONS if o.name == "backend"]
    assert opt.parse(f" {name} ") == name


@pytest.mark.parametrize("text", ["NCCL", "gl oo", "nccl,", "cpu:", "9ccl", "nccl;rm"])
def test_a_backend_of_another_form_is_refused_naming_the_form(text):
    (opt,) = [o for o in options.OPTIONS if o.name == "backend"]
    with pytest.raises(ValueError, match="or a torch.distributed backend's name such as gloo, nccl"):
        opt.parse(text)


@pytest.mark.parametrize(
    "env, backend, gpus, size, chosen",
    [
        ({"DS_ACCELERATOR": "hpu"}, "auto", 0, 2, None),  # the user's: respected, never overwritten
        ({"DS_ACCELERATOR": "cpu"}, "nccl", 8, 2, None),
        ({}, "auto", 0, 2, None),  # DeepSpeed's detection decides in the ranks (an HPU, an XPU, the CPU)
        ({}, "auto", 4, 2, "cuda"),
        ({}, "auto", 1, 2, "cpu"),  # a small GPU machine still runs the suite, on the CPU
        ({}, "gloo", 4, 2, "cpu"),
        ({}, "nccl", 4, 2, "cuda"),
        ({}, "hccl", 0, 2, None),
    ],
)
def test_ds_accelerator_is_set_only_where_unset_and_implied(monkeypatch, env, backend, gpus, size, chosen):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(accel, "cuda_devices", lambda: gpus)
    assert accel.chosen(backend, size) == chosen


def test_nccl_under_another_accelerator_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(accel, "cuda_devices", lambda: 8)
    monkeypatch.setenv("DS_ACCELERATOR", "hpu")
    with pytest.raises(ValueError, match="--zero3-backend=nccl runs on CUDA devices, but DS_ACCELERATOR=hpu"):
        accel.check("nccl", 2)
    monkeypatch.setenv("DS_ACCELERATOR", "")
    with pytest.raises(ValueError, match="DS_ACCELERATOR is set but empty"):
        accel.check("auto", 2)


def _assert_cpu_through_the_adapter(run, header: str):
    assert run.returncode == 0, run.stdout[-4000:]
    assert header in run.stdout, run.stdout[:3000]
    info = run.report["implementation"]
    assert (info["accelerator"], info["backend"], info["world_size"]) == ("cpu", "gloo", 2), info
    assert "accelerator cpu; backend gloo; world size 2" in run.stdout, run.stdout[-3000:]


def test_the_cpu_accelerator_runs_through_the_adapter(run_pytest):
    """DS_ACCELERATOR=cpu (as CI runs): ``auto`` is the CPU accelerator's backend, gloo, in the ranks."""
    run = run_pytest(str(DATA / "accelerator_case.py"), "--zero3-backend=auto", "-s")
    _assert_cpu_through_the_adapter(
        run, "zero3: accelerator=cpu (DS_ACCELERATOR); backend=auto: the accelerator's communication backend"
    )
    assert run.stdout.count("SEEN cpu gloo cpu cpu") == 2, run.stdout[-3000:]


@pytest.mark.skipif(accel.cuda_devices() > 0, reason="with CUDA devices visible, auto sets DS_ACCELERATOR=cuda")
def test_with_ds_accelerator_unset_deepspeed_detects_the_cpu(tmp_path, warm_forkserver):
    """Unset, the plugin leaves DS_ACCELERATOR unset (no CUDA device here): DeepSpeed's detection picks
    the accelerator in the ranks, as it would pick an HPU or an XPU.  A pytest of its own (its
    environment differs), forking its forkserver from this process's zygote."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    report = tmp_path / "r.json"
    args = ["-p", "no:cacheprovider", str(DATA / "accelerator_case.py"), "-s", f"--zero3-report={report}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    run = SimpleNamespace(returncode=proc.returncode, stdout=proc.stdout + proc.stderr)
    run.report = json.loads(report.read_text()) if report.exists() else None
    _assert_cpu_through_the_adapter(run, "zero3: accelerator=DeepSpeed's detection, in the ranks; backend=auto")
    assert run.stdout.count("SEEN cpu gloo cpu None") == 2, run.stdout[-3000:]
