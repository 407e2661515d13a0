"""Harness cost, measured side by side in one run: zero3_world versus a fresh torchrun world per scenario.

Prints: the first world's cost (forkserver start-up: imports, DeepSpeed's CPU comm op), the
per-scenario wall time after warm-up for an empty scenario and for a tiny ZeRO-3 scenario
(initialize a 6-layer MLP engine, train 5 steps), and the same two scenarios each launched as a
fresh ``torchrun --nproc_per_node=2`` world, with the ratio torchrun / harness.

    DS_ACCELERATOR=cpu python benchmarks/harness.py [--reps 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def empty():
    return None


def tiny():
    from pytest_zero3.fixtures.benchmark import tiny_steps

    return tiny_steps()


def _torchrun_once(which: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        ["torchrun", "--nproc_per_node=2", "--standalone", __file__, "--rank-body", which],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def _rank_body(which: str) -> None:
    """What one torchrun rank does: join the world, run the scenario, leave."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if which == "tiny":
        tiny()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rank-body", default=None)
    args = parser.parse_args()
    if args.rank_body:
        return _rank_body(args.rank_body)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from pytest_zero3.world import World

    world = World(2, "gloo", 600, "installed", tempfile.mkdtemp(prefix="zero3-bench-"))

    t = time.perf_counter()
    world.run(empty)
    first = time.perf_counter() - t
    world.run(tiny)  # warm caches the tiny scenario touches once per forkserver

    def timed(fn):
        out = []
        for _ in range(args.reps):
            t = time.perf_counter()
            world.run(fn)
            out.append(time.perf_counter() - t)
        return statistics.median(out)

    results = {}
    for name, fn in (("empty", empty), ("tiny ZeRO-3", tiny)):
        harness = timed(fn)
        fresh = statistics.median(
            _torchrun_once("tiny" if fn is tiny else "empty") for _ in range(max(2, args.reps // 2))
        )
        results[name] = (harness, fresh)

    print(f"first world (forkserver start-up included): {first:.2f} s")
    print(f"{'scenario':<14}{'zero3_world':>14}{'fresh torchrun':>16}{'ratio torchrun/harness':>24}")
    for name, (harness, fresh) in results.items():
        print(f"{name:<14}{harness:>12.3f} s{fresh:>14.2f} s{fresh / harness:>22.1f}x")


if __name__ == "__main__":
    main()
