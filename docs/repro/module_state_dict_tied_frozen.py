"""engine.module_state_dict(exclude_frozen_parameters=True) keeps a frozen param under its tied name (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/module_state_dict_tied_frozen.py  (1 rank, gloo) prints the names of
the state dict without frozen params: 'out.weight', the frozen embedding tied to the head, is still
there, while save_16bit_model with the same option leaves it out.  module_state_dict drops the names
named_parameters() gives, one per param.  Seq family (seq-a).
"""

import os

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
deepspeed.init_distributed("gloo")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.out.weight = self.inp.weight  # an embedding tied to the head
        self.inp.requires_grad_(False)  # frozen: the head's bias still trains

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))


model = Tied()
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=[model.out.bias], config=config)
print("module_state_dict:", sorted(engine.module_state_dict(exclude_frozen_parameters=True)))
engine.save_16bit_model("/tmp/zero3-repro-tied", exclude_frozen_parameters=True)
print("save_16bit_model:", sorted(torch.load("/tmp/zero3-repro-tied/pytorch_model.bin", weights_only=True)))
