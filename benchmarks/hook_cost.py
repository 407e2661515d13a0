"""Micro-benchmark: the coordinator's own Python cost per hook call, collectives stubbed out.

Run as ``python benchmarks/hook_cost.py`` (one CPU process). For each model it builds two engines
of the same model, one with stock deepspeed's coordinator and one with the reference, trains two
steps (record, then a complete pass) and records every coordinator call DeepSpeed's hooks make in a
third step (``reset_step``, ``trace_prologue``, ``fetch_sub_module``, ``release_sub_module``,
``release_backward_leftovers``, ``release_and_reset_all``, the trace-mode queries). Then every
parameter's ``all_gather_coalesced`` and ``partition`` are replaced by stubs that only flip
``ds_status`` (no communication, no copy), and the recorded calls are replayed pass after pass,
in interleaved blocks (stock, reference, reference, stock, ...). What is left is the coordinator's
bookkeeping: what stock spends per hook is the floor to beat.

Printed per model: median microseconds per hook call for each, their ratio reference/stock and a
bootstrap 95% interval of that ratio over blocks. ``--profile`` prints the reference's cProfile.
"""

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402
from ranks import join_world, launch  # noqa: E402
from stats import ratio_interval  # noqa: E402

RECORDED = (
    "reset_step",
    "trace_prologue",
    "is_record_trace",
    "is_complete_trace",
    "is_invalid_trace",
    "record_module",
    "fetch_sub_module",
    "release_sub_module",
    "release_backward_leftovers",
    "release_and_reset_all",
)


def config(args):
    return {
        "train_batch_size": args.batch,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": args.prefetch_bucket,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "gradient_clipping": 0.0,
    }


def coordinator_of(engine):
    return engine.optimizer.parameter_offload.get_param_coordinator()


class _Handle:
    __slots__ = ("params", "available")

    def __init__(self, params, available):
        self.params, self.available = params, available

    def wait(self, **_):
        for p in self.params:
            p.ds_status = self.available


def stub_collectives(model) -> None:
    """Gathers and partitions that only flip ``ds_status``: the coordinator's cost is what is left."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    for p in model.parameters():
        p.data = torch.empty(p.ds_shape)

        def all_gather_coalesced(params, quantize=False, **_):
            for q in params:
                q.ds_status = ZeroParamStatus.INFLIGHT
            return _Handle(list(params), ZeroParamStatus.AVAILABLE)

        def partition(param_list=None, hierarchy=0, has_been_updated=False, free_data=True, _p=p):
            for q in param_list or [_p]:
                q.ds_status = ZeroParamStatus.NOT_AVAILABLE

        p.all_gather_coalesced = all_gather_coalesced
        p.partition = partition


def record_calls(engine, make_batch, generator):
    """One training step's coordinator calls, as ``[(method name, args, kwargs)]``."""
    coord = coordinator_of(engine)
    calls = []
    originals = {name: getattr(coord, name) for name in RECORDED}
    depth = [0]

    def recorder(name, original):
        def call(*args, **kwargs):
            if depth[0] == 0:  # DeepSpeed's call, not the coordinator calling itself
                calls.append((name, args, kwargs))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for name, original in originals.items():
        setattr(coord, name, recorder(name, original))
    x, y = make_batch(generator)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    for name in RECORDED:
        delattr(coord, name)
    return [(getattr(coord, name), args, kwargs) for name, args, kwargs in calls]


def replay(calls, passes):
    start = time.perf_counter()
    for _ in range(passes):
        for method, args, kwargs in calls:
            method(*args, **kwargs)
    return time.perf_counter() - start


def prepare(impl, name, args):
    import deepspeed

    from pytest_zero3 import reference_impl

    (reference_impl.install if impl == "reference" else reference_impl.uninstall)()
    model, make_batch = models.build(name, args)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(args))
    generator = torch.Generator().manual_seed(1234)
    for _ in range(2):
        x, y = make_batch(generator)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    calls = record_calls(engine, make_batch, generator)
    assert coordinator_of(engine).is_complete_trace(), f"{impl}: the trace is not complete after two steps"
    stub_collectives(engine.module)
    replay(calls, 2)  # warm-up
    return engine, calls


def worker(rank, args, store):
    join_world(rank, args.world, store)
    print(
        f"per-hook coordinator cost, collectives stubbed; {args.blocks} interleaved blocks of {args.passes} "
        f"passes each; prefetch bucket {args.prefetch_bucket}"
    )
    for name in args.models:
        prepared = {impl: prepare(impl, name, args) for impl in ("stock", "reference")}
        per_hook = {impl: [] for impl in prepared}
        for block in range(args.blocks):
            for impl in ("stock", "reference") if block % 2 == 0 else ("reference", "stock"):
                calls = prepared[impl][1]
                per_hook[impl].append(replay(calls, args.passes) / (args.passes * len(calls)))
        hooks = {impl: len(calls) for impl, (_, calls) in prepared.items()}
        low, mid, high = ratio_interval(per_hook["reference"], per_hook["stock"])
        assert hooks["stock"] == hooks["reference"], f"DeepSpeed's hooks made different calls: {hooks}"
        print(f"{name}: {hooks['stock']} coordinator calls from DeepSpeed's hooks per pass")
        for impl in ("stock", "reference"):
            print(f"  {impl:>9}: median {statistics.median(per_hook[impl]) * 1e6:7.2f} us per call")
        print(f"  ratio reference/stock {mid:.3f}  95% interval [{low:.3f}, {high:.3f}]")
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            replay(prepared["reference"][1], args.passes)
            profiler.disable()
            stats = pstats.Stats(profiler).sort_stats("tottime")
            stats.print_stats(25)
            stats.print_callers("_named_members|hasattr")
        for engine, _ in prepared.values():
            engine.destroy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models.add_arguments(parser)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--prefetch-bucket", type=int, default=int(5e7), help="deepspeed's default")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    args.world = 1
    launch(worker, args)


if __name__ == "__main__":
    main()
