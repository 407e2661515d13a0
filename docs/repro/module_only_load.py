"""load_checkpoint(load_module_only=True) under ZeRO-3 keeps the fresh weights (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/module_only_load.py  (1 rank, gloo) prints the largest difference
between the saved weights and the loaded ones: 0 with load_optimizer_states=False, about 0.5 (the
fresh engine's own initial weights) with the default load_optimizer_states=True. The module state
dict saved beside the ZeRO partitions holds torch.Size([0]) placeholders; only load_optimizer_states=
False reads the weights from the partitions. Contract 008-d.
"""

import os
import tempfile

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29562")
deepspeed.init_distributed("gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def engine(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 13), torch.nn.Tanh(), torch.nn.Linear(13, 7))
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(config))[0]


def weights(e):
    with deepspeed.zero.GatheredParameters(list(e.module.parameters())):
        return [p.detach().clone() for p in e.module.parameters()]


ckpt = tempfile.mkdtemp()
trained = engine(0)
trained.backward(trained(torch.randn(2, 16)).pow(2).mean())
trained.step()
trained.save_checkpoint(ckpt, tag="t")
saved = weights(trained)
for optimizer_states in (False, True):
    fresh = engine(1)
    fresh.load_checkpoint(ckpt, tag="t", load_module_only=True, load_optimizer_states=optimizer_states)
    diff = max((a - b).abs().max().item() for a, b in zip(saved, weights(fresh)))
    print(f"load_module_only=True, load_optimizer_states={optimizer_states}: max |saved - loaded| = {diff:.3g}")
