"""The frameworks' CPU shims (``fixtures/accelerate_cpu.py``) are still needed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

_PROBE = """
from pytest_zero3.fixtures import accelerate_cpu
print("needed" if accelerate_cpu.needed() else "not needed")
"""


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed")
def test_accelerate_still_picks_no_backend_on_a_cpu_world():
    """Why: the shim exists only because accelerate picks no backend for a torchrun-style world on a
    machine without a GPU; when an accelerate release picks one, this fails and the shim can go."""
    env = dict(os.environ, LOCAL_RANK="0", RANK="0", WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "needed", (
        "this accelerate picks a backend for a CPU world by itself: remove fixtures/accelerate_cpu.py's "
        f"patch (and this test)\n{proc.stdout}"
    )


_BF16_PROBE = """
from pytest_zero3.fixtures import accelerate_cpu
print("refused" if accelerate_cpu.bf16_refused() else "accepted")
"""


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_still_refuses_bf16_on_a_cpu():
    """Why: the bf16 shim exists only because transformers refuses ``TrainingArguments(bf16=True)`` without a
    GPU unless ``use_cpu`` (which turns DeepSpeed off); when a release accepts it, this fails and the shim can go."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _BF16_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "refused", (
        "this transformers accepts bf16 on a CPU without use_cpu: remove fixtures/accelerate_cpu.py's bf16 "
        f"patch (and this test)\n{proc.stdout}"
    )
