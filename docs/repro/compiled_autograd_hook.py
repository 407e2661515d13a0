"""engine.compile(compiled_autograd_enabled=True) under ZeRO-3 crashes in the first backward (deepspeed
0.19.8, torch 2.13, on the CPU).

DS_ACCELERATOR=cpu python docs/repro/compiled_autograd_hook.py  (1 rank, gloo) trains a 2-layer MLP for
three steps with the eager backend.  Stock raises in the first backward: compiled autograd hands stage
3's post-accumulate-grad hook (reduce_partition_and_remove_grads) to dynamo, whose fake copy of the
partitioned param (its .data 1-D and empty, its grad 2-D) fails with "AssertionError: 1 != 2" in
torch/fx/experimental/symbolic_shapes.py.  With `--eager-hooks` each gradient hook is registered
wrapped in torch.compiler.disable (what the reference does: reference_impl/install.py), and the three
steps run; the script prints each step's loss and the CPU seconds it took, which shows the second
finding: every backward is traced afresh, seconds per step where a cached graph would take
milliseconds.  Stage 3's memory-efficient linear runs each F.linear through an autograd Function that
dynamo traces into torch's autograd_function_apply op, which makes a new Function class at every call:
compiled autograd never sees the same node twice.  `--plain-linear` sets
zero_optimization.memory_efficient_linear to false: then the cache hits from the third step.
"""

import os
import sys
import time

import deepspeed
import torch

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
deepspeed.init_distributed("gloo")
if "--eager-hooks" in sys.argv:
    from deepspeed.runtime.zero import stage3

    register = stage3.register_grad_hook
    stage3.register_grad_hook = lambda param, hook: register(param, torch.compiler.disable(hook))
config = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_allow_untested_optimizer": True,
    "optimizer": {"type": "SGD", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}
if "--plain-linear" in sys.argv:
    config["zero_optimization"]["memory_efficient_linear"] = False
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.compile(backend="eager", compiled_autograd_enabled=True)
for step in range(3):
    start = time.process_time()
    loss = engine(torch.randn(2, 8)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    print(f"step {step}: loss {loss.item():.4f}, {time.process_time() - start:.1f} CPU-s")
