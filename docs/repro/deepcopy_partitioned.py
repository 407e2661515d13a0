"""copy.deepcopy of a ZeRO-3 wrapped model gives a copy with no weights (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/deepcopy_partitioned.py  (1 rank, gloo) prints every param of the
copy with shape (0,) and no ZeRO-3 attributes, then "copy forward raised AttributeError: 'Parameter'
object has no attribute 'ds_status'". Plain torch's copy holds the weights; DeepSpeed neither copies
them nor refuses. Contract 008-e.
"""

import copy
import os

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
deepspeed.init_distributed("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 13), torch.nn.Tanh(), torch.nn.Linear(13, 7))
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x = torch.randn(2, 16)
engine.backward(engine(x).pow(2).mean())
engine.step()
copied = copy.deepcopy(engine.module)  # no error
print({n: (tuple(p.shape), hasattr(p, "ds_id")) for n, p in copied.named_parameters()})
try:
    copied(x)
except AttributeError as exc:
    print(f"copy forward raised AttributeError: {exc}")
