"""zero.Init(zero_param_parallel_group=G) sizes hpZ's secondary partitions by another group than G (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/init_param_group_sizes.py  (4 ranks, gloo, spawned here) builds one
Linear(13, 7) under ``zero.Init(config, zero_param_parallel_group=G)`` with ``zero_hpz_partition_size: 2``
and G the pair of ranks this rank is in (a node of 2, as the hpZ docs draw it), then runs a forward.
Init gathers each secondary partition over G, but sizes it and picks this rank's slice by DeepSpeed's own
hpZ group, which nothing has made before the first engine, so it reads the whole world: rank 0 prints a
secondary partition of 23 elements where a group of 2 holds 46 (91 padded to 92, over 2), and the forward raises "allgather: invalid
tensor size".  The same model under the config alone (the engine makes DeepSpeed's group) trains.
Contract 008-j.
"""

import os

import torch
import torch.multiprocessing as mp


def run(rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    import deepspeed
    import deepspeed.comm as dist

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "stage3_param_persistence_threshold": 0},
    }
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    with deepspeed.zero.Init(config_dict_or_path=config, zero_param_parallel_group=pairs[rank // 2]):
        model = torch.nn.Linear(13, 7)
    if rank == 0:
        print(f"secondary partition: {model.weight.ds_secondary_tensor.numel()} elements (a group of 2: 46)")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    try:
        engine(torch.randn(2, 13)).sum()
        print(f"rank {rank}: forward ran", flush=True)
    except RuntimeError as e:
        print(f"rank {rank}: forward raised {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    mp.spawn(run, args=(29591,), nprocs=4)
