"""003-g (device-side all-gather delays) is unsupported on the CPU with its reason, and on CUDA flags a
controller that times waits with host timers while the reference passes.

The CUDA half needs 2 GPUs and runs in scripts/gpu-check.sh; in CPU-only CI it is skipped (by
``skipif``, with the reason), and the CPU half costs one pytest run of one contract (about 30 s).
"""

from pathlib import Path

import pytest

from pytest_zero3.world import gpu_count

BAD = Path(__file__).resolve().parent / "bad_coordinators"
needs_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="003-g runs on CUDA devices: needs 2 GPUs")


@pytest.mark.skipif(gpu_count() >= 2, reason="on GPUs 003-g runs for real (see the tests below)")
def test_unsupported_on_cpu_with_the_reason(run_suite):
    run = run_suite("reference", "003-g")
    row = next(c for c in run.report["contracts"] if c["id"] == "003-g")
    assert row["outcome"] == "unsupported", f"{row}\n{run.stdout[-3000:]}"
    assert row["reason"].startswith("003-g: it delays every all-gather on the device itself"), row["reason"]
    assert run.returncode == 0, run.stdout[-3000:]


@needs_two_gpus
def test_flags_host_timers_on_cuda(run_suite):
    run = run_suite(
        f"{BAD / 'adaptive_host_timers.py'}:AdaptiveHostTimersCoordinator",
        "003-g",
        "--zero3-backend=nccl",
        f"--zero3-world-size={min(gpu_count(), 4)}",
    )
    assert run.failed_ids() == {"003-g"}, f"{run.outcomes()}\n{run.stdout[-4000:]}"


@needs_two_gpus
def test_reference_passes_on_cuda(run_suite):
    run = run_suite("reference", "003-g", "--zero3-backend=nccl", f"--zero3-world-size={min(gpu_count(), 4)}")
    assert run.outcomes().get("003-g") == "pass", f"{run.outcomes()}\n{run.stdout[-4000:]}"
