"""Benchmark: deepspeed's stock ZeRO-3 coordinator against reference_impl, same model and data.

Run as ``python benchmarks/coordinator.py``: it starts its own 2-rank gloo world on CPU. For each
model (``small``: 8 x Linear(256); ``deep``: 24 transformer blocks, see ``models.py``) and each
``stage3_max_reuse_distance`` given (default: deepspeed's 1e9), each rank builds one engine with
stock's coordinator and one with the reference, same initial weights, and trains them step by step
*interleaved* (stock, reference, reference, stock, ...: drift and load spikes hit both alike),
each step timed as the slowest rank's forward + backward + optimizer step. Reported per model:

* the median step time of each, and the ratio reference / stock of the medians with a bootstrap 95%
  interval (``--steps`` measured steps per engine; the interval is what says whether the ratio is
  decided: it must not straddle 1 for a claim either way);
* the peak gathered numel: the largest sum of ``ds_numel`` over AVAILABLE parameters seen at any
  sampling point (after each module's pre-forward fetch and after each module's backward), over
  two more, untimed, steps;
* the largest loss difference between the two (they train on the same batches from the same weights).

The decisive run, on a quiet machine: ``python benchmarks/coordinator.py --steps 400 --warmup 20``
(estimated 10-15 minutes on 2 quiet CPU cores; ``--steps 40 --warmup 5`` took 3.3 minutes at load
average 15, so about 30 minutes under that load); ``--steps 20`` checks it works.
``benchmarks/hook_cost.py`` measures the coordinators' per-hook cost with collectives stubbed out.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402
from ranks import join_world, launch  # noqa: E402
from stats import ratio_interval  # noqa: E402

IMPLS = ("stock", "reference")


def ds_config(args, reuse_distance):
    return {
        "train_batch_size": args.batch * args.world,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_reuse_distance": reuse_distance,
            "stage3_prefetch_bucket_size": args.prefetch_bucket,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "gradient_clipping": 0.0,
    }


class GatheredNumelProbe:
    """Samples the gathered numel of a model from its own module hooks (black box)."""

    def __init__(self, model):
        self.model = model
        self.peak = 0
        self.handles = [m.register_forward_pre_hook(self._pre_forward) for m in model.modules()]

    def sample(self, *_):
        gathered = sum(p.ds_numel for p in self.model.parameters() if p.ds_status.name == "AVAILABLE")
        self.peak = max(self.peak, gathered)

    def _pre_forward(self, module, inputs):
        # runs after ZeRO's fetch hook; the input hook fires once the module's backward is done,
        # before ZeRO's post-backward release
        self.sample()
        for tensor in inputs:
            if torch.is_tensor(tensor) and tensor.requires_grad:
                tensor.register_hook(self.sample)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def build_engine(impl, name, args, reuse_distance):
    import deepspeed

    from pytest_zero3 import reference_impl

    (reference_impl.install if impl == "reference" else reference_impl.uninstall)()
    model, make_batch = models.build(name, args)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(args, reuse_distance)
    )
    return engine, make_batch


def timed_step(engine, x, y):
    from deepspeed import comm as dist

    dist.barrier()
    start = time.perf_counter()
    loss = nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    return time.perf_counter() - start, loss.item()


def compare(args, name, reuse_distance, rank):
    from deepspeed import comm as dist

    engines = {}
    for impl in IMPLS:
        engines[impl], make_batch = build_engine(impl, name, args, reuse_distance)
    generator = torch.Generator().manual_seed(1234 + rank)
    times = {impl: [] for impl in IMPLS}
    losses = {impl: [] for impl in IMPLS}
    for i in range(args.warmup + args.steps):
        x, y = make_batch(generator)
        for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
            elapsed, loss = timed_step(engines[impl], x, y)
            if i >= args.warmup:
                times[impl].append(elapsed)
                losses[impl].append(loss)
    probes = {}
    for impl in IMPLS:  # peak gathered numel: two more steps each, untimed (the probe is not free)
        probes[impl] = GatheredNumelProbe(engines[impl].module)
        for _ in range(2):
            timed_step(engines[impl], *make_batch(generator))
        probes[impl].remove()
    slowest = {}
    for impl in IMPLS:
        engines[impl].destroy()
        per_step = torch.tensor(times[impl], dtype=torch.float64)
        dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
        slowest[impl] = per_step.tolist()
    if rank == 0:
        low, ratio, high = ratio_interval(slowest["reference"], slowest["stock"])
        loss_diff = max(abs(a - b) for a, b in zip(losses["stock"], losses["reference"]))
        print(f"{name}, stage3_max_reuse_distance {reuse_distance}:")
        for impl in IMPLS:
            print(
                f"  {impl:>9}: median step {statistics.median(slowest[impl]) * 1e3:8.2f} ms   "
                f"peak gathered numel {probes[impl].peak:>10,}"
            )
        print(
            f"  ratio reference/stock (median step time): {ratio:.3f}  95% interval [{low:.3f}, {high:.3f}]   "
            f"max |loss difference|: {loss_diff:.3g}",
            flush=True,
        )


def worker(rank, args, store):
    join_world(rank, args.world, store)
    if rank == 0:
        print(
            f"{args.world} ranks, batch {args.batch}/rank, prefetch bucket {args.prefetch_bucket}; "
            f"{args.steps} measured steps per engine ({args.warmup} warm-up), interleaved",
            flush=True,
        )
    for name in args.models:
        for reuse_distance in args.reuse_distances:
            compare(args, name, reuse_distance, rank)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models.add_arguments(parser)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reuse-distances", type=int, nargs="+", default=[int(1e9)])
    parser.add_argument(
        "--prefetch-bucket", type=int, default=int(5e7), help="stage3_prefetch_bucket_size (default: deepspeed's)"
    )
    args = parser.parse_args()
    launch(worker, args)


if __name__ == "__main__":
    main()
