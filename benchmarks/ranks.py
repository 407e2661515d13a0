"""Starting a benchmark's own CPU world: one spawned process per rank, joined through a FileStore.

Benchmarks compare implementations inside the same ranks (``pytest_zero3.reference_impl.install()`` /
``uninstall()`` between runs), so they start one long-lived world rather than a harness world per
scenario.
"""

import glob
import os
import tempfile

import torch
import torch.multiprocessing as mp


def join_world(rank: int, world: int, store: str) -> None:
    """Called first in each rank: environment, one thread, quiet deepspeed, gloo process group."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_SIZE=str(world), MASTER_ADDR="127.0.0.1"
    )  # MASTER_PORT comes from launch()
    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel("ERROR")
    deepspeed.init_distributed(dist_backend="gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def launch(worker, args) -> None:
    """Run ``worker(rank, args, store)`` on ``args.world`` spawned ranks and wait for them.

    DeepSpeed's CPU comm op maps /dev/shm files named by MASTER_ADDR/PORT and never removes them;
    the port is unique to this launch so that its files can be removed afterwards.
    """
    port = str(20000 + os.getpid() % 40000)
    os.environ["MASTER_PORT"] = port
    try:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(worker, args=(args, os.path.join(tmp, "store")), nprocs=args.world, start_method="spawn")
    finally:
        for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
            os.remove(path)
