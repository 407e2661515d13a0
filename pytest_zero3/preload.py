"""Imported once by the forkserver, so every rank forked from it starts with these modules loaded.

A freshly spawned rank spends seconds importing torch and deepspeed (and torch._dynamo, which
torch.optim pulls in lazily on first use).  The forkserver pays that once; a rank forked from it
starts in milliseconds.  What to load is read from the environment the parent set before the
forkserver started.
"""
import faulthandler
import gc
import importlib
import os
import signal

from pytest_zero3.spawner import PRELOAD_ENV, STACK_ENV

#: Always loaded: the harness itself and what any ZeRO-3 rank imports.
BASE = ("pytest", "_pytest.outcomes", "torch", "torch.distributed", "torch.optim", "torch._dynamo", "torch.utils.checkpoint")
#: Loaded when importable: deepspeed and the parts it imports lazily during initialize().
DEEPSPEED = ("deepspeed", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.muon.muon_optimizer",
             "deepspeed.runtime.zero.partition_parameters", "deepspeed.ops.adam")


def _load_all() -> None:
    stack_path = os.environ.get(STACK_ENV)
    if stack_path:  # lets the parent see where a slow or stuck preload is
        faulthandler.register(signal.SIGUSR1, file=open(stack_path, "w"), all_threads=True)
    for name in BASE:
        importlib.import_module(name)
    extra = [m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m]
    for name in DEEPSPEED + tuple(extra):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # reported by the rank that needs it, with its own traceback
    _probe_deepspeed_ops()
    _build_cpu_comm_op()
    from pytest_zero3 import impl
    spec = impl.parse(os.environ.get(impl.SPEC_ENV, "installed"))
    if spec.kind == "class":
        impl.load_class(spec)  # checked in the parent already; imported here so ranks inherit it
    # DeepSpeed calls gc.collect() while building the optimizer; with torch's import graph in the heap
    # that takes over a second per rank.  Frozen objects are skipped by the collector.
    gc.collect()
    gc.freeze()


def _probe_deepspeed_ops() -> None:
    """DeepSpeed probes which ops could build (running a C compiler) on first use: do it once, here."""
    try:
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__
    except Exception:
        pass


def _build_cpu_comm_op() -> None:
    """Build DeepSpeed's CPU shared-memory comm op here, once, instead of in every rank of the first world."""
    if os.environ.get("DS_ACCELERATOR") != "cpu":
        return
    try:
        from deepspeed.accelerator import get_accelerator
        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is not None and builder.is_compatible():
            builder.load(verbose=False)
    except Exception:
        pass  # deepspeed falls back to plain gloo collectives; the ranks will say so if it matters


_load_all()
