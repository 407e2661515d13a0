"""After load_checkpoint under hpZ a frozen param computes with its pre-load values (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/hpz_frozen_after_load.py  (4 ranks, gloo, zero_hpz_partition_size 2):
rank 0 prints the loss of the saved engine and of a fresh engine (other initial weights) that loaded
its checkpoint, on the same batch; they differ, and gathering the frozen weight shows the loaded
values.  The load restores the primary partitions; checkpoint_event_epilogue's invalidate_secondary_tensor
walks only the optimizer's groups, so the frozen param keeps the secondary shard built from its
initial weights, and the forward all-gathers from it.  Contract 007-e under the hpz profile.
"""

import os
import tempfile

import torch
import torch.multiprocessing as mp


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen, self.a = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.a(torch.tanh(self.frozen(x)))


def engine_from(seed, ws):
    import deepspeed

    torch.manual_seed(seed)
    model = Net()
    cfg = {
        "train_batch_size": 2 * ws,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "stage3_param_persistence_threshold": 0},
    }
    params = [p for p in model.parameters() if p.requires_grad]
    return deepspeed.initialize(model=model, model_parameters=params, config=cfg)[0]


def run(rank, ws, directory):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29514", RANK=str(rank), WORLD_SIZE=str(ws), LOCAL_RANK=str(rank)
    )
    import deepspeed

    torch.distributed.init_process_group("gloo", rank=rank, world_size=ws)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(rank))
    saved = engine_from(0, ws)
    saved.save_checkpoint(directory, tag="t")
    with torch.no_grad():
        want = saved(x).pow(2).mean().item()
    resumed = engine_from(1, ws)  # other initial weights: the load must replace them all
    resumed.load_checkpoint(directory, tag="t")
    with torch.no_grad():
        got = resumed(x).pow(2).mean().item()
    with deepspeed.zero.GatheredParameters([saved.module.frozen.weight, resumed.module.frozen.weight]):
        same = torch.equal(saved.module.frozen.weight, resumed.module.frozen.weight)
    if rank == 0:
        print(f"loss saved {want:.6f}, resumed {got:.6f}; frozen weight gathered equal after the load: {same}")


if __name__ == "__main__":
    mp.spawn(run, args=(4, tempfile.mkdtemp()), nprocs=4)
