"""gradient_predivide_factor equal to the world size halves every gradient at 2 ranks (deepspeed 0.14.5-0.19.8).

DS_ACCELERATOR=cpu python docs/repro/predivide_equal_to_world.py  (2 ranks, gloo, spawned here) prints the
gradient of one weight read with safe_get_full_grad beside plain torch's mean over the two ranks' batches,
for gradient_predivide_factor 1.0, 2.0 (the world size) and 4.0, with "reduce_scatter": false (stage 3
refuses a factor other than 1.0 with reduce-scatter).  Stock prints ratio 1.000 for 1.0 and 4.0, and
0.500 for 2.0: stage 3's all-reduce of a bucket divides by the factor and the world size, sums, and
multiplies by the factor again only where the factor is not the world size.  Contract 008-h.
"""

import os

import torch
import torch.multiprocessing as mp


def run(rank: int, factor: float, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_predivide_factor": factor,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "reduce_scatter": False},
    }
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    plain = torch.nn.Linear(8, 4)
    plain.load_state_dict(model.state_dict())
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    batches = [torch.randn(2, 8, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    engine.backward(engine(batches[rank]).pow(2).mean())
    got = safe_get_full_grad(engine.module.weight)
    torch.stack([plain(b).pow(2).mean() for b in batches]).mean().backward()
    if rank == 0:
        ratio = (got.flatten()[0] / plain.weight.grad.flatten()[0]).item()
        print(f"gradient_predivide_factor {factor}: DeepSpeed / plain torch = {ratio:.3f}")
    engine.destroy()


if __name__ == "__main__":
    for i, factor in enumerate((1.0, 2.0, 4.0)):
        mp.spawn(run, args=(factor, 29570 + i), nprocs=2)
