"""A param that a module returns from its forward is never partitioned by a ZeRO-3 hook.

DeepSpeed's docs ("Registering External Parameters", case 2 "Returning a parameter") say it registers the
returned param with the module that uses it, and ``register_external_parameter`` says DeepSpeed then
coordinates its "collection and partitioning in the forward and backward passes of module".  In 0.19.8,
``_post_forward_module_hook`` does register it with the caller, but also sets ``param.is_external_param =
True`` for good, and ``release_sub_module`` and ``release_backward_leftovers`` skip every param with that
flag, whichever module releases: the caller never partitions it, nor does the end of backward.  It stays
gathered until the optimizer step's ``partition_all_parameters``, and in a no-grad (eval / generation) loop
it is never partitioned at all.

Run: DS_ACCELERATOR=cpu python returned_param_stays_gathered.py   (one process, gloo)
"""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


class Offset(nn.Module):  # a learned positional embedding / bias module
    def __init__(self, w):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(w))

    def forward(self):
        return self.weight


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.lin = nn.Linear(w, w)
        self.offset = Offset(w)

    def forward(self, x):
        return torch.tanh(self.lin(x) + self.offset())


model = nn.Sequential(Block(8), nn.Linear(8, 8))
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_max_reuse_distance": 0,
        "stage3_prefetch_bucket_size": 0,
    },
}
deepspeed.init_distributed(dist_backend="gloo")
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)


def gathered():
    return sorted(n for n, p in model.named_parameters() if p.ds_status.name != "NOT_AVAILABLE")


x = torch.randn(2, 8)
loss = engine(x).pow(2).mean()
print(
    "after forward:  ",
    gathered(),
    "| is_external_param:",
    model[0].offset.weight.is_external_param,
    "| registered with:",
    [n for n, m in model.named_modules() if id(model[0].offset.weight) in getattr(m, "_external_params", {})],
)
engine.backward(loss)
print("after backward: ", gathered())
engine.step()
print("after step:     ", gathered())
engine.eval()
with torch.no_grad():
    for _ in range(3):
        engine(x)
        print("after eval pass:", gathered())
bad = "0.offset.weight" in gathered()
print("BUG: the returned param is never partitioned by a hook" if bad else "ok: partitioned")
