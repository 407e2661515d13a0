"""engine.offload_states() raises on a model with a frozen param (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/offload_states_frozen.py  (1 rank, gloo) prints "offload_states raised
RuntimeError: start (20) + length (16) exceeds dimension size (20)" for a frozen first layer (a LoRA base,
a frozen embedding) and for a frozen last layer.  The optimizer's 16-bit partitions are one flat buffer
of the params it trains; offload_states points every param of the module into the moved buffer, frozen
ones included, in the module's order, and runs past its end.  Seq family (seq-a).
"""

import os

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29562")
deepspeed.init_distributed("gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},  # offload_states asserts DeepSpeed's FusedAdam
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}
for frozen in (0, 2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    model[frozen].requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config)
    engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
    engine.step()
    try:
        engine.offload_states()
        engine.reload_states()
        print(f"frozen layer {frozen}: offload_states and reload_states returned")
    except RuntimeError as exc:
        print(f"frozen layer {frozen}: offload_states raised RuntimeError: {exc}")
    engine.destroy()
