"""Persistent params are released while the first trace is recorded (deepspeed 0.19.8; DeepSpeed bug 12).

While the trace is being recorded, ``release_sub_module`` releases every param of the module, the
``ds_persist`` ones (under ``stage3_param_persistence_threshold``) included; only the complete-trace path
leaves them alone.  With one micro-batch per step the optimizer step's re-gather of persistent params hides
it; with gradient accumulation the first micro-step has no optimizer step and they stay partitioned.

    DS_ACCELERATOR=cpu python docs/repro/persistent_released_while_recording.py             # stock
    DS_ACCELERATOR=cpu python docs/repro/persistent_released_while_recording.py reference   # the reference

Stock prints "after micro-step 0 (optimizer stepped: False): persistent params not gathered: ['2.weight',
'2.bias', '3.weight', '3.bias']"; the reference prints no param after any micro-step.
"""

import os
import sys

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")


def main(impl: str) -> None:
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if impl == "reference":
        from pytest_zero3.reference_impl.install import install

        install()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    # the embedding table is above DeepSpeed's default threshold (1e5 elements), the Linears persist
    model = torch.nn.Sequential(
        torch.nn.Embedding(100000, 2), torch.nn.Flatten(), torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
    }
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    for micro in range(4):
        loss = engine(torch.randint(0, 100000, (2, 4))).pow(2).mean()
        engine.backward(loss)
        engine.step()
        left = [
            n for n, p in engine.module.named_parameters() if p.ds_persist and p.ds_status != ZeroParamStatus.AVAILABLE
        ]
        print(
            f"after micro-step {micro} (optimizer stepped: {(micro + 1) % 2 == 0}): persistent params not gathered: {left}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "installed")
