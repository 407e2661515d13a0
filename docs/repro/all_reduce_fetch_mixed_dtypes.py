"""stage3_use_all_reduce_for_fetch_params raises on a fetch of params of two dtypes (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/all_reduce_fetch_mixed_dtypes.py  (2 ranks, gloo, spawned here).  A
loralib-style layer holds a frozen base weight loaded in bf16 and trainable fp32 adapters, all its own
params; the config is fp32 (DeepSpeed leaves the model's dtypes as they are) and fetches params by
all-reduce.  The first forward raises "expected there to be only one unique element": the all-reduce
fetch builds one flat buffer for the whole fetch in the one dtype of its params
(``get_only_unique_item(p.ds_tensor.dtype for p in params)``), where the default all-gather fetch groups
the params by dtype and trains.  The same happens wherever one fetch holds both dtypes: a prefetch
across a bf16 module and an fp32 one (PEFT's adapters beside a bf16 base) too.
"""

import os

import torch
import torch.multiprocessing as mp


class LoRA(torch.nn.Module):
    def __init__(self, w: int = 4, r: int = 2):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(w, w).to(torch.bfloat16), requires_grad=False)
        self.lora_a = torch.nn.Parameter(torch.randn(r, w))
        self.lora_b = torch.nn.Parameter(torch.randn(w, r))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(x.dtype)) + x @ self.lora_a.t() @ self.lora_b.t()


def run(rank: int, port: int, all_reduce: bool) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    import deepspeed

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_use_all_reduce_for_fetch_params": all_reduce},
    }
    torch.manual_seed(0)
    model = LoRA()
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    try:
        loss = engine(torch.randn(2, 4)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        print(f"rank {rank}, all-reduce fetch {all_reduce}: trained, loss {loss.item():.4f}", flush=True)
    except RuntimeError as exc:
        print(f"rank {rank}, all-reduce fetch {all_reduce}: the forward raised RuntimeError: {exc}", flush=True)


if __name__ == "__main__":
    mp.spawn(run, args=(29594, False), nprocs=2)
    mp.spawn(run, args=(29595, True), nprocs=2)
