"""zero.Init(module=...) leaves an already built model's params in fp32 under a bf16 config (deepspeed 0.14.5-0.19.8).

DS_ACCELERATOR=cpu python docs/repro/init_module_keeps_dtype.py  (1 rank, gloo, spawned here) builds one
Linear under ``with zero.Init(config)`` and one beside it, partitioned by ``zero.Init(module=model, config)``,
whose docstring says "partition the model as if it was constructed in the context".  It prints each one's
partition dtype after ``deepspeed.initialize`` under ``"bf16": {"enabled": true}``, then runs a bf16 forward.
Stock prints torch.bfloat16 for the first and torch.float32 for the second: Init casts params made in its
context (its tensor constructors) but not the params of a module handed to it, and the engine skips its own
cast for a model whose params are already ZeRO params.  The forward then raises "mat1 and mat2 must have the
same dtype".  Contract 008-j.
"""

import os

import torch
import torch.multiprocessing as mp


def run(rank: int, port: int) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
    }
    with deepspeed.zero.Init(config_dict_or_path=config):
        built_inside = torch.nn.Linear(8, 4)
    handed_over = torch.nn.Linear(8, 4)
    deepspeed.zero.Init(module=handed_over, config_dict_or_path=config)
    for name, model in (("built in the context", built_inside), ("Init(module=model)", handed_over)):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        print(f"{name}: partition dtype {model.weight.ds_tensor.dtype}", flush=True)
        try:
            engine(torch.randn(2, 8, dtype=torch.bfloat16))
            print(f"{name}: bf16 forward ran")
        except RuntimeError as e:
            print(f"{name}: bf16 forward raised {e}")
        engine.destroy()


if __name__ == "__main__":
    mp.spawn(run, args=(29590,), nprocs=1)
