"""A training script with the ZeRO-3 rule judge watching: a tiny Hugging Face Llama, prefetch on.

The judge is three lines around an ordinary DeepSpeed training loop; it reads the rule config
(prefetch bucket, max live, reuse distance, persistence threshold) from the engine, judges steps 0
and 1 and then every ``--every``-th, and fails the run with every violation it found::

    DS_ACCELERATOR=cpu torchrun --nproc_per_node=2 examples/train_with_judge.py --steps 8 --every 4
    torchrun --nproc_per_node=8 examples/train_with_judge.py           # on GPUs

Nothing is downloaded: the model is built from a config in code.  ``tests/test_judge.py`` runs
:func:`train` on a 2-rank world.
"""

import argparse

import torch

import pytest_zero3

VOCAB, HIDDEN, SEQ, MICRO_BATCH = 64, 16, 8, 2


def tiny_llama(layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4 * SEQ,
        use_cache=False,
    )
    torch.manual_seed(0)  # the same initial weights on every rank
    return LlamaForCausalLM(config)


def deepspeed_config(world_size: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "train_batch_size": MICRO_BATCH * world_size,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1000,  # prefetch on: about a decoder layer's projections ahead
            "stage3_param_persistence_threshold": 0,  # a model this small would otherwise persist whole
        },
    }


def train(steps: int = 6, every: int = 1, check: bool = True):
    """Train ``steps`` steps under the judge and return it (``.violations``, ``.report()``); with ``check``
    a broken rule raises ``pytest_zero3.judging.RuleViolations`` listing every violation."""
    import deepspeed
    import torch.distributed as dist

    model = tiny_llama()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=deepspeed_config(dist.get_world_size())
    )
    generator = torch.Generator().manual_seed(1234 + dist.get_rank())
    with pytest_zero3.judge(engine, every=every, check=check) as judge:
        for _ in range(steps):
            ids = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ), generator=generator).to(engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    engine.destroy()
    return judge


def main() -> None:
    import deepspeed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=4, help="judge steps 0 and 1, then every N-th")
    args = parser.parse_args()
    deepspeed.init_distributed()
    judge = train(args.steps, args.every)  # raises RuleViolations, listing them, when a rule is broken
    print(f"rank {deepspeed.comm.get_rank()}: {judge.report()}")


if __name__ == "__main__":
    main()
