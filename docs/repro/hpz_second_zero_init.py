"""A second model built under ``deepspeed.zero.Init`` with hpZ in the same process raises.

DeepSpeed keeps the hpZ group (``zero_hpz_partition_size``) in a process global,
``deepspeed.utils.groups._ZERO_PARAM_INTRA_PARALLEL_GROUP``.  ``zero.Init`` creates it whenever it is not
handed one, and ``_create_zero_param_parallel_group`` asserts that it is unset: the first model (a
policy) builds, the second (its reference model, a ``from_pretrained`` nested in a model's constructor)
raises ``AssertionError: ZeRO parameter intra parallel group is already initialized``.  DeepSpeed issue
4901 (open); PR 8361 (open) reuses a group of the same size.  The rule family builds many engines per
process, so it forgets the group before each example (``rule.generated._forget_hpz_group``), as a fresh
process would.

Run: DS_ACCELERATOR=cpu python hpz_second_zero_init.py   (two processes, gloo)
"""

import os

import torch
import torch.multiprocessing as mp

CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}


def run(rank, world):
    os.environ.update(
        DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29617",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_SIZE=str(world),
    )
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    with deepspeed.zero.Init(config_dict_or_path=CONFIG):
        torch.nn.Linear(8, 8)  # the policy
    try:
        with deepspeed.zero.Init(config_dict_or_path=CONFIG):
            torch.nn.Linear(8, 8)  # its reference model, same config
        outcome = "second zero.Init with hpZ: ok"
    except AssertionError as exc:
        outcome = f"second zero.Init with hpZ raised AssertionError: {exc}"
    if rank == 0:
        print(outcome, flush=True)


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
