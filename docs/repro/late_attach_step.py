"""A module attached after deepspeed.initialize crashes the next engine.step() (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/late_attach_step.py  (2 ranks, gloo): each rank prints
"engine.step() raised AttributeError: 'Parameter' object has no attribute 'ds_active_sub_modules'".
The forward and backward after the attach work (DeepSpeed PR 8009); the step's
partition_all_parameters -> release_and_reset_all reads every param of the model. Contract 007-a.
"""

import os

import torch
import torch.multiprocessing as mp


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if "late" in self._modules:
            h = self.late(h)
        return self.b(h)


def run(rank, ws):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29512", RANK=str(rank), WORLD_SIZE=str(ws), LOCAL_RANK=str(rank)
    )
    import deepspeed

    torch.distributed.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    model = Net()
    cfg = {
        "train_batch_size": 2 * ws,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.module.late = torch.nn.Linear(8, 8)  # attached after initialize
    engine.backward(engine(torch.randn(2, 8)).pow(2).mean())  # fine since PR 8009
    try:
        engine.step()
        print(f"rank {rank}: step ok")
    except AttributeError as e:
        print(f"rank {rank}: engine.step() raised AttributeError: {e}")


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
