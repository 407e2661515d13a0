"""Benchmark: forward peak gathered numel at ``stage3_max_reuse_distance=0``, stock vs reference.

Run as ``python benchmarks/reuse_distance.py``: it starts its own 2-rank gloo world on CPU and, in
each rank, trains the same model on the same data twice: once with deepspeed's own coordinator
(``pytest_zero3.reference_impl.uninstall()``) and once with the reference (``pytest_zero3.reference_impl.install()``).  During
the forward passes of the steps that follow the trace-recording step it samples, at every module's
forward pre-hook (after DeepSpeed's fetch) and post-hook (after its release):

* the gathered numel: sum of ``ds_numel`` over AVAILABLE params (a large prefetch bucket gathers
  upcoming layers too: waiting on one coalesced all-gather makes its whole batch AVAILABLE);
* the gathered numel of layers whose forward already completed (at distance 0 it should be 0);
* the resident numel: AVAILABLE plus INFLIGHT (prefetched, buffer already allocated).

Each is reported for a prefetch bucket of one layer and of 5e7 elements (``--prefetch-bucket``).

This is the memory that issue 7670 is about (contract family 000); it is measured once, not timed.
"""

import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pytest_zero3.fixtures.config import zero3_config  # noqa: E402
from pytest_zero3.fixtures.models import MLP  # noqa: E402
from ranks import join_world, launch  # noqa: E402

IMPLS = ("stock", "reference")


class ForwardPeak:
    """Peaks over forward hook points, forward passes only: gathered numel, resident numel, and the
    gathered numel of modules whose forward has already completed (what issue 7670 leaves behind)."""

    def __init__(self, model):
        self.model, self.on = model, False
        self.gathered = self.resident = self.stale = 0
        self.done = set()
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(lambda *_: self.sample()))
            self.handles.append(m.register_forward_hook(self._post))

    def _post(self, module, *_):
        self.sample()
        if self.on and module is not self.model:
            self.done.update(id(p) for p in module.parameters())

    def sample(self):
        if not self.on or torch._C._current_graph_task_id() != -1:
            return
        status = [(p.ds_status.name, p.ds_numel, id(p)) for p in self.model.parameters()]
        self.gathered = max(self.gathered, sum(n for s, n, _ in status if s == "AVAILABLE"))
        self.resident = max(self.resident, sum(n for s, n, _ in status if s in ("AVAILABLE", "INFLIGHT")))
        self.stale = max(self.stale, sum(n for s, n, i in status if s == "AVAILABLE" and i in self.done))

    def remove(self):
        for h in self.handles:
            h.remove()


def run_one(impl, bucket, args, rank):
    import deepspeed

    from pytest_zero3 import reference_impl

    (reference_impl.install if impl == "reference" else reference_impl.uninstall)()
    torch.manual_seed(0)
    model = MLP(args.layers, args.width)
    config = zero3_config(
        args.world, zero={"stage3_max_reuse_distance": args.reuse_distance, "stage3_prefetch_bucket_size": bucket}
    )
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    probe = ForwardPeak(engine.module)
    g = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for step in range(args.steps):
        probe.on, probe.done = step > 0, set()  # step 0 records the trace; decisions need a complete one
        x = torch.randn(config["train_micro_batch_size_per_gpu"], args.width, generator=g)
        loss = engine(x).float().pow(2).mean()
        probe.on = False
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    probe.remove()
    engine.destroy()
    reference_impl.uninstall()
    return probe.gathered, probe.resident, probe.stale, losses


def worker(rank, args, store):
    join_world(rank, args.world, store)
    layer = args.width * args.width + args.width
    buckets = args.prefetch_bucket or [layer, int(5e7)]
    results = {(impl, b): run_one(impl, b, args, rank) for b in buckets for impl in IMPLS}
    if rank == 0:
        print(
            f"model: {args.layers} x Linear({args.width},{args.width}) ({layer:,} elements per layer, "
            f"{layer * args.layers:,} in all), {args.world} ranks, stage3_max_reuse_distance "
            f"{args.reuse_distance}, {args.steps - 1} measured steps"
        )
        for b in buckets:
            print(f"prefetch bucket {b:,}:")
            for impl in IMPLS:
                gathered, resident, stale, _ = results[impl, b]
                print(
                    f"  {impl:>9}: forward peak gathered numel {gathered:>9,} ({gathered / layer:.2f} layers); "
                    f"of layers already run {stale:>9,} ({stale / layer:.2f}); "
                    f"with in-flight prefetch {resident:>9,} ({resident / layer:.2f})"
                )
            diff = max(abs(x - y) for x, y in zip(results["stock", b][3], results["reference", b][3]))
            print(f"  max |loss difference| stock vs reference: {diff:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reuse-distance", type=int, default=0)
    parser.add_argument(
        "--prefetch-bucket",
        type=int,
        action="append",
        help="prefetch bucket size(s); default: one layer's numel, then 5e7",
    )
    args = parser.parse_args()
    launch(worker, args)


if __name__ == "__main__":
    main()
