"""Benchmark: deepspeed's stock ZeRO-3 coordinator against reference_impl, same model and data.

Run as ``python benchmarks/coordinator.py``: it starts its own 2-rank gloo world on CPU. For each
``stage3_max_reuse_distance`` given (default: deepspeed's 1e9, then 0), each repetition trains a
fresh engine with each coordinator in turn (the order alternates between repetitions so drift and
warm-up effects hit both alike). Reported per coordinator:

* the median step time (forward + backward + optimizer step, slowest rank per step) over all
  measured steps, and the ratio reference / stock;
* the peak gathered numel: the largest sum of ``ds_numel`` over AVAILABLE parameters seen at any
  sampling point, sampled after each module's pre-forward fetch and after each module's backward
  (before its release);
* the largest loss difference between the two, as a check that they train identically.
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

from ranks import join_world, launch  # noqa: E402

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


def build_model(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(args.width, 1))


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


def run_one(impl, args, reuse_distance, rank):
    import deepspeed
    from pytest_zero3 import reference_impl
    from deepspeed import comm as dist

    if impl == "reference":
        reference_impl.install()
    else:
        reference_impl.uninstall()
    model = build_model(args)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(args, reuse_distance))
    generator = torch.Generator().manual_seed(1234 + rank)
    batches = [(torch.randn(args.batch, args.width, generator=generator), torch.randn(args.batch, 1, generator=generator))
               for _ in range(args.warmup + args.steps)]
    probe = None
    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        if i == args.warmup:
            probe = GatheredNumelProbe(model)
        dist.barrier()
        start = time.perf_counter()
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)
            losses.append(loss.item())
    probe.remove()
    engine.destroy()
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist(), probe.peak, losses


def worker(rank, args, store):
    join_world(rank, args.world, store)

    if rank == 0:
        print(f"model: {args.layers} x Linear({args.width},{args.width}), batch {args.batch}/rank, {args.world} ranks, "
              f"prefetch bucket {args.prefetch_bucket}; {args.reps} alternating repetitions x {args.steps} "
              f"measured steps ({args.warmup} warm-up)")
    for reuse_distance in args.reuse_distances:
        compare(args, reuse_distance, rank)


def compare(args, reuse_distance, rank):
    times = {impl: [] for impl in IMPLS}
    peaks = {impl: 0 for impl in IMPLS}
    losses = {impl: [] for impl in IMPLS}
    for rep in range(args.reps):
        for impl in (IMPLS if rep % 2 == 0 else IMPLS[::-1]):
            step_times, peak, rep_losses = run_one(impl, args, reuse_distance, rank)
            times[impl] += step_times
            peaks[impl] = max(peaks[impl], peak)
            losses[impl] = rep_losses
    if rank == 0:
        medians = {impl: statistics.median(times[impl]) for impl in IMPLS}
        loss_diff = max(abs(a - b) for a, b in zip(losses["stock"], losses["reference"]))
        print(f"stage3_max_reuse_distance {reuse_distance}:")
        for impl in IMPLS:
            print(f"  {impl:>9}: median step {medians[impl] * 1e3:8.2f} ms   peak gathered numel {peaks[impl]:>10,}")
        print(f"  ratio reference/stock (median step time): {medians['reference'] / medians['stock']:.3f}   "
              f"max |loss difference|: {loss_diff:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--reuse-distances", type=int, nargs="+", default=[int(1e9), 0])
    parser.add_argument("--prefetch-bucket", type=int, default=2 * 256 * 257,
                        help="stage3_prefetch_bucket_size (default: about two layers)")
    args = parser.parse_args()
    launch(worker, args)


if __name__ == "__main__":
    main()
