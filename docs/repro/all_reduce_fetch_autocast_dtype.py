"""Under torch_autocast, stage3_use_all_reduce_for_fetch_params changes the forward's values (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/all_reduce_fetch_autocast_dtype.py  (2 ranks, gloo, spawned here).  One
Linear with a bias, fp32 weights, ``torch_autocast`` in bf16: stage 3 marks the Linear's params to travel in
bf16 (``get_allgather_dtype``).  The all-gather fetch gathers them in bf16, and so does the all-reduce fetch
of a single param (``_all_gather_sequential``); the all-reduce fetch of two or more params builds one flat
buffer in the dtype of their partitions (``get_only_unique_item(p.ds_tensor.dtype ...)``) and gathers them in
fp32.  It shows where an op outside autocast's casts reads a param: stage 3's linear (``zero3_linear_wrap``,
which replaces ``F.linear``) adds the bias in place, in its own dtype, for an input that is not 2-D.  So the
same model, weights and batch give other outputs (and gradients) with the all-reduce fetch, and with it
they depend on how the coordinator batches a fetch, which a prefetch bucket or a module's param count decides.
"""

import os

import torch
import torch.multiprocessing as mp


def run(rank: int, port: int, all_reduce: bool) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    import deepspeed

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
        "zero_optimization": {"stage": 3, "stage3_use_all_reduce_for_fetch_params": all_reduce},
    }
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    torch.manual_seed(1)
    out = engine(torch.randn(1, 3, 4))  # 3-D: the bias is added in place, outside autocast's casts
    if rank == 0:
        print(f"all-reduce fetch {all_reduce}: {out.flatten()[:6].tolist()}", flush=True)


if __name__ == "__main__":
    mp.spawn(run, args=(29596, False), nprocs=2)
    mp.spawn(run, args=(29597, True), nprocs=2)
