"""A model with a 0-dim param fails in deepspeed.initialize under ZeRO-3 (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/scalar_param_broadcast.py  (1 rank, gloo) prints "initialize raised
RuntimeError: self.dim() cannot be 0 to view Float as Byte (different element sizes)", and the same for
the model built under deepspeed.zero.Init. Plain torch trains the model. Contract 008-f (scalar).
"""

import os

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29562")
deepspeed.init_distributed("gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {"stage": 3},
}


class Scaled(torch.nn.Module):
    """A Linear and a learnable 0-dim scale (a layer scale, a logit temperature)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.scale = torch.nn.Parameter(torch.tensor(1.25))

    def forward(self, x):
        return self.linear(x) * self.scale


for how in ("deepspeed.initialize", "zero.Init"):
    try:
        if how == "zero.Init":
            with deepspeed.zero.Init(config_dict_or_path=config):
                model = Scaled()
        else:
            model = Scaled()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        print(f"{how}: initialized")
    except RuntimeError as exc:
        print(f"{how}: initialize raised RuntimeError: {exc}")
