"""A model wrapped again after destroy() runs its backward hooks into the destroyed engine (deepspeed 0.19.8).

DeepSpeed bug 11 (contract 006-c), standalone, 2 ranks on gloo: wrap the same model three times; per
wrap train one micro-step, run two no-grad forwards inside unwrap_model_for_generation, train one more
micro-step, destroy.  From the second wrap on, the modules' backward functions (built once, closing
over the first wrap's offload) run into the destroyed engine: after a backward before the accumulation
boundary the first Linear stays AVAILABLE and claimed, and unwrap_model_for_generation raises "Cannot
free a ZeRO-3 parameter while it is still active in submodules".

    DS_ACCELERATOR=cpu python docs/repro/rewrap_backward_hooks.py installed    # stock: raises at wrap 2
    DS_ACCELERATOR=cpu python docs/repro/rewrap_backward_hooks.py reference    # the reference: clean
"""

import os
import sys

import torch
import torch.multiprocessing as mp
from torch import nn

WIDTH = 16
ACCUMULATION = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.out(torch.tanh(self.block(torch.tanh(self.inp(x)))))


def run(rank, world_size, impl):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29614", RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    import deepspeed
    from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

    if impl == "reference":
        from pytest_zero3.reference_impl.install import install

        install()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Net()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": ACCUMULATION,
        "train_batch_size": 2 * ACCUMULATION * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }

    def show(tag):
        held = [
            (n, sorted(p.ds_active_sub_modules), p.ds_status.name)
            for n, p in model.named_parameters()
            if p.ds_active_sub_modules or p.ds_status.name != "NOT_AVAILABLE"
        ]
        if rank == 0:
            print(f"  {tag}: {held or 'every param partitioned, none claimed'}", flush=True)

    def train(engine, tag):
        engine.backward(engine(torch.randn(2, WIDTH)).float().pow(2).mean())
        show(f"{tag}, after backward")
        engine.step()

    for wrap in range(1, 4):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        train(engine, f"wrap {wrap}")
        try:
            for _ in range(2):
                with unwrap_model_for_generation(engine), torch.no_grad():
                    model(torch.randn(2, WIDTH))
        except RuntimeError as exc:
            if rank == 0:
                print(f"  wrap {wrap}: unwrap_model_for_generation raised: {str(exc)[:90]}...", flush=True)
            return
        train(engine, f"wrap {wrap}, after the generations")
        engine.destroy()


if __name__ == "__main__":
    mp.spawn(run, args=(2, sys.argv[1] if len(sys.argv) > 1 else "installed"), nprocs=2)
