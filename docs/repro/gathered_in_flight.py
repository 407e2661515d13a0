"""GatheredParameters between a forward and its backward reads in-flight params empty (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/gathered_in_flight.py  (2 ranks, gloo): each rank prints
"rank R: in flight ['1.weight', '1.bias'], inside {'1.weight': (0,), '1.bias': (0,)}; exit raised
AssertionError: Cannot partition a param in flight" (their full shapes are (16, 16) and (16,)).
At the end of the forward the coordinator has prefetched the backward's first params;
GatheredParameters gathers only NOT_AVAILABLE ones.  Contract 005-f.
"""

import os

import torch
import torch.multiprocessing as mp

WIDTH = 16
LAYER = WIDTH * WIDTH + WIDTH


def run(rank, ws):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29513", RANK=str(rank), WORLD_SIZE=str(ws), LOCAL_RANK=str(rank)
    )
    import deepspeed

    torch.distributed.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)))
    cfg = {
        "train_batch_size": 2 * ws,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {
            "stage": 3,
            "stage3_max_reuse_distance": 3 * LAYER - 1,  # keeps the last layers for backward
            "stage3_prefetch_bucket_size": 3 * LAYER,  # prefetches the layer before them
            "stage3_max_live_parameters": 3 * LAYER,
            "stage3_param_persistence_threshold": 0,  # every param partitioned
        },
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for step in range(2):  # step 0 records the trace; step 1 prefetches from it
        loss = engine(torch.randn(2, WIDTH)).pow(2).mean()
        if step == 1:
            inflight = [n for n, p in model.named_parameters() if p.ds_status.name == "INFLIGHT"]
            try:
                with deepspeed.zero.GatheredParameters(list(model.parameters())):  # to log a weight norm, say
                    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in inflight}
                print(f"rank {rank}: in flight {inflight}, inside {shapes}; exit ok")
            except AssertionError as e:
                print(
                    f"rank {rank}: in flight {inflight}, inside {shapes}; exit raised AssertionError: "
                    + " ".join(str(e).split()[-6:])
                )
                return
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
