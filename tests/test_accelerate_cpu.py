"""The frameworks' CPU shims (``fixtures/accelerate_cpu.py``) are still needed, and the header names the
deepspeed the frameworks import.  One probe process answers all three (importing the frameworks costs
seconds)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

_PROBE = """
from pytest_zero3.fixtures import accelerate_cpu
print("backend", "needed" if accelerate_cpu.needed() else "not needed")
print("bf16", "refused" if accelerate_cpu.bf16_refused() else "accepted")
from pytest_zero3 import impl
print("seen", impl.frameworks_seen())
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """``{question: answer}`` from one process on a torchrun-style CPU world (``LOCAL_RANK`` set, no GPU)."""
    if importlib.util.find_spec("accelerate") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("the frameworks are not installed (pip install transformers accelerate)")
    env = dict(os.environ, LOCAL_RANK="0", RANK="0", WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(
        line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ", 1)[0] in ("backend", "bf16", "seen")
    )


def test_accelerate_still_picks_no_backend_on_a_cpu_world(probe):
    """Why: the shim exists only because accelerate picks no backend for a torchrun-style world on a
    machine without a GPU; when an accelerate release picks one, this fails and the shim can go."""
    assert probe["backend"] == "needed", (
        "this accelerate picks a backend for a CPU world by itself: remove fixtures/accelerate_cpu.py's patch (and this test)"
    )


def test_transformers_still_refuses_bf16_on_a_cpu(probe):
    """Why: the bf16 shim exists only because transformers refuses ``TrainingArguments(bf16=True)`` without a
    GPU unless ``use_cpu`` (which turns DeepSpeed off); when a release accepts it, this fails and the shim can go."""
    assert probe["bf16"] == "refused", (
        "this transformers accepts bf16 on a CPU without use_cpu: remove fixtures/accelerate_cpu.py's bf16 patch (and this test)"
    )


def test_the_header_names_the_deepspeed_the_frameworks_import(probe):
    """Why (issue 55): transformers and accelerate use deepspeed only where installed metadata says one
    exists, and then import whatever ``deepspeed`` resolves to: the header says both, per run."""
    from importlib import metadata

    seen = probe["seen"]
    assert seen.startswith("transformers ") and "accelerate " in seen, seen
    assert f"installed metadata: {metadata.version('deepspeed')}" in seen and "import deepspeed from " in seen, seen
