"""Benchmark: the reference's adaptive prefetch bucket against a static bucket, on CPU (2-rank gloo).

Run as ``python benchmarks/adaptive_prefetch.py``: it starts its own gloo world and, in each rank,
trains the same model on the same data twice with the reference coordinator installed: once with a
static ``stage3_prefetch_bucket_size`` and once with ``stage3_adaptive_prefetch_bucket_size`` from
that same start (bounds ``--min``/``--max``), timed with the controller's own clock (host
``perf_counter`` on CPU; CUDA events on a GPU).  It prints

* the bucket trajectory of the adaptive run: ``prefetch_bucket_size`` after every step, the number
  of decisions and the last group-reduced wait ratio (identical on every rank by construction);
* the median step time of each run over the steps after ``--warmup``, and their ratio adaptive/static;
* whether the losses of the two runs are bitwise equal (they must be: contract 003-e).

Timings on a shared 2-core box are noisy: read the ratio as "about the same" unless it is far from 1.
Gloo all-gathers on CPU run while the caller blocks, so prefetching hides little; the figure shows the
controller's overhead and where it settles rather than a speed-up.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pytest_zero3.fixtures.config import zero3_config  # noqa: E402
from pytest_zero3.fixtures.engine import batch, coordinator, train_step  # noqa: E402
from pytest_zero3.fixtures.models import MLP  # noqa: E402
from ranks import join_world, launch  # noqa: E402


def run_one(adaptive, args, rank, layer):
    import deepspeed

    torch.manual_seed(0)
    model = MLP(args.layers, args.width)
    zero = {"stage3_prefetch_bucket_size": args.start or layer}
    if adaptive:
        zero.update(
            stage3_adaptive_prefetch_bucket_size=True,
            stage3_adaptive_prefetch_min_size=args.min or layer // 2,
            stage3_adaptive_prefetch_max_size=args.max or 4 * layer * args.layers,
        )
    config = zero3_config(args.world, zero=zero)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    coord = coordinator(engine)
    if adaptive and args.interval:
        coord.adaptive.interval = args.interval
    times, losses, trajectory = [], [], []
    for step in range(args.steps):
        x, _ = batch(step, (config["train_micro_batch_size_per_gpu"], args.width), rank, args.world)
        start = time.perf_counter()
        losses.append(train_step(engine, x))
        times.append(time.perf_counter() - start)
        trajectory.append(coord.prefetch_bucket_size)
    extra = (coord.adaptive.decisions, coord.adaptive.last_ratio) if adaptive else (0, None)
    engine.destroy()
    return times, losses, trajectory, extra


def worker(rank, args, store):
    join_world(rank, args.world, store)
    from pytest_zero3 import reference_impl

    reference_impl.install()
    layer = args.width * args.width + args.width
    static = run_one(False, args, rank, layer)
    adaptive = run_one(True, args, rank, layer)
    if rank != 0:
        return
    print(
        f"model: {args.layers} x Linear({args.width},{args.width}) ({layer:,} elements per layer), {args.world} "
        f"ranks (gloo, CPU), {args.steps} steps, first {args.warmup} not timed; start bucket "
        f"{args.start or layer:,}, adaptive bounds [{args.min or layer // 2:,}, "
        f"{args.max or 4 * layer * args.layers:,}], decision every {args.interval or 'default'} fetches"
    )
    print("adaptive bucket after each step: " + ", ".join(f"{b:,}" for b in adaptive[2]))
    decisions, ratio = adaptive[3]
    print(f"decisions: {decisions}; last group wait ratio: {ratio if ratio is None else round(ratio, 3)}")
    med = [statistics.median(run[0][args.warmup :]) for run in (static, adaptive)]
    print(
        f"median step time: static {med[0] * 1e3:.1f} ms, adaptive {med[1] * 1e3:.1f} ms; "
        f"ratio adaptive/static {med[1] / med[0]:.3f}"
    )
    print(f"losses bitwise equal: {static[1] == adaptive[1]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--start", type=int, default=0, help="starting/static bucket (default: one layer)")
    parser.add_argument("--min", type=int, default=0, help="adaptive min (default: half a layer)")
    parser.add_argument("--max", type=int, default=0, help="adaptive max (default: 4x the model)")
    parser.add_argument("--interval", type=int, default=0, help="fetches per decision (default: the controller's)")
    args = parser.parse_args()
    # the harness's per-deepspeed extension directory: DeepSpeed JIT-builds its CPU comm op at
    # init_distributed, and torch's shared default directory may hold another build's stale lock
    from pytest_zero3 import impl

    impl.prepare_process(impl.parse("reference"))
    launch(worker, args)


if __name__ == "__main__":
    main()
