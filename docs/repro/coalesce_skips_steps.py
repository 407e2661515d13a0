"""engine.coalesce_grad_reduction() under gradient accumulation skips steps (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/coalesce_first_window.py  (1 rank, gloo) prints, per window, whether
the step() after the with-block applied an update.  With "gradient_accumulation_steps": 2 and each
window's last backward marked as the boundary (the pattern of DeepSpeed's own test), stock prints
"step applied False, weights moved False" for windows 0 and 2: the block's exit restores the boundary
flag saved at its entry (None), so step() falls back to its own count (one per step() call, a boundary
every second call), and a skipped window's gradients are carried into the next one.  "One with-block == one optimizer step" (its
docstring) holds only with gradient_accumulation_steps 1, the configuration DeepSpeed's test uses.
Contract 008-g (coalesce).
"""

import os

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
deepspeed.init_distributed("gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {"stage": 3},
}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for window in range(3):
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        before = [p.detach().clone() for p in engine.module.parameters()]
    with engine.coalesce_grad_reduction():
        for i in range(2):
            engine.set_gradient_accumulation_boundary(i == 1)
            engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
    engine.step()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        moved = any(not torch.equal(b, p) for b, p in zip(before, engine.module.parameters()))
    print(f"window {window}: step applied {engine.was_step_applied()}, weights moved {moved}")
