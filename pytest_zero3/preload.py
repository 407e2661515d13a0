"""Imported once by the forkserver, so every rank forked from it starts with these modules loaded.

A freshly spawned rank spends seconds importing torch and deepspeed (and torch._dynamo, which
torch.optim pulls in lazily on first use).  The forkserver pays that once; a rank forked from it
starts in milliseconds.  What to load comes from the job payload the parent wrote before the
forkserver started (:func:`pytest_zero3.spawner.payload_path`).
"""

import faulthandler
import gc
import importlib
import os
import pickle
import signal
import sys

from pytest_zero3.spawner import payload_path

#: Always loaded: the harness itself and what any ZeRO-3 rank imports.
BASE = (
    "pytest",
    "_pytest.outcomes",
    "torch",
    "torch.distributed",
    "torch.optim",
    "torch._dynamo",
    "torch.utils.checkpoint",
)
#: Loaded when importable: deepspeed and the parts it imports lazily during initialize().
DEEPSPEED = (
    "deepspeed",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "deepspeed.runtime.zero.partition_parameters",
    "deepspeed.ops.adam",
)


def _load_all() -> None:
    try:
        with open(payload_path(os.getppid()), "rb") as fh:
            job = pickle.load(fh)
    except OSError:  # started by something other than pytest_zero3.spawner: load the basics only
        job = dict(preload=[], sys_path=[], spec="installed", stack="")
    if job["stack"]:  # lets the parent see where a slow or stuck preload is
        faulthandler.register(signal.SIGUSR1, file=open(job["stack"], "w"), all_threads=True)
    # The parent's path, in its order: a fork checkout first, then test-local modules.
    sys.path[:0] = [entry for entry in job["sys_path"] if entry not in sys.path]
    for name in BASE:
        importlib.import_module(name)
    for name in DEEPSPEED + tuple(job["preload"]):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # reported by the rank that needs it, with its own traceback
    _probe_deepspeed_ops()
    _skip_cpu_shm_comm_op()
    from pytest_zero3 import impl

    spec = impl.parse(job["spec"])
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

        deepspeed.ops.__compatible_ops__  # noqa: B018 - reading it runs the probe
    except Exception:
        pass


def _skip_cpu_shm_comm_op() -> None:
    """Keep DeepSpeed's CPU shared-memory all-reduce op out of the ranks.

    On CPU, DeepSpeed's comm backend JIT-builds an op (about 40 s once) that maps two 66 MB files in
    /dev/shm per rank, named by MASTER_ADDR/PORT and never removed: a suite forks hundreds of worlds
    and would fill the machine's memory.  The op only speeds up CPU all-reduce; ZeRO-3's parameter
    coordination does not depend on it, so the ranks use plain gloo collectives instead.
    """
    if os.environ.get("DS_ACCELERATOR") != "cpu":
        return
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            deepspeed.ops.__compatible_ops__[builder.NAME] = False
    except Exception:
        pass  # an older deepspeed without this op: nothing to skip


_load_all()
