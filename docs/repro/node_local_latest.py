"""checkpoint.use_node_local_storage writes 'latest' on global rank 0 only (deepspeed 0.19.8).

DS_ACCELERATOR=cpu python docs/repro/node_local_latest.py  (2 ranks, gloo, spawned here) stands for two
nodes of one rank each (LOCAL_RANK 0 on both), each saving to a directory of its own, as on a cluster
without a shared file system, under ``"checkpoint": {"use_node_local_storage": true}``.  Each node's
directory gets its ranks' checkpoint files, but only rank 0's gets ``latest``.  A fresh engine then
resumes without a tag, as HF's Trainer does: rank 1 prints "loaded: None" (DeepSpeed warned "Unable to
find latest file" and skipped the load) and holds its initial weights, while rank 0 loads and waits in
the load's last all-gather (of the persistent params), which rank 1 never joins: a hang in a real job,
here "Connection closed by peer" once rank 1 exits.  Without persistent params (the suite's contract 008-i
sets the threshold to 0) nothing waits, and the ranks train on from different weights, silently.
"""

import os
import tempfile

import torch
import torch.multiprocessing as mp


def run(rank: int, port: int, root: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    import deepspeed

    deepspeed.init_distributed("gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
        "checkpoint": {"use_node_local_storage": True},
    }
    node_dir = os.path.join(root, f"node{rank}")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.save_checkpoint(node_dir, tag="step1")
    print(f"rank {rank}: 'latest' in its node's directory: {os.path.isfile(os.path.join(node_dir, 'latest'))}")
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 4)
    fresh, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    path, _ = fresh.load_checkpoint(node_dir)
    print(f"rank {rank}: loaded: {path}", flush=True)


if __name__ == "__main__":
    mp.spawn(run, args=(29592, tempfile.mkdtemp()), nprocs=2)
