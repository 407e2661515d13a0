"""``pytest_zero3.judge`` on an engine a user builds: a tiny Hugging Face Llama, ZeRO-3, prefetch on.

Each scenario first puts in the implementation under test (the harness's part, ``impl.apply``); the
rest is what a user writes in a test of their own.  The judge must stay silent on the reference,
flag a known-bad coordinator (``tests/bad_coordinators/prefetch_counts_shards.py``: the prefetch
bucket filled with per-rank shard sizes, so prefetch gathers about twice the bucket at two ranks)
with the rule, step, module and param, and a sampling judge must find, on the steps it judges,
exactly what the every-step judge finds there.  Cost: three 2-rank worlds of a few steps each.
"""

from pathlib import Path

import pytest
import torch
from pytest_zero3.fixtures.models import hf as hf_models

import pytest_zero3
from pytest_zero3 import impl, scenario

ROOT = Path(__file__).resolve().parent.parent
BAD = f"{ROOT}/tests/bad_coordinators/prefetch_counts_shards.py:PrefetchCountsShards"
MICRO_BATCH, STEPS = 2, 4

pytestmark = pytest.mark.zero3_preload("transformers")


def tiny_llama_engine():
    """The user's part: a tiny Llama built into a ZeRO-3 engine with prefetch on."""
    import deepspeed
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_models.tiny_llama_config(layers=2))
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "train_batch_size": MICRO_BATCH * scenario.world_size(),
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1000,
            "stage3_max_reuse_distance": 0,
            "stage3_param_persistence_threshold": 0,
        },
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def train_judged(engine, every: int):
    """The user's training loop under the judge; ``(judge, message of the RuleViolations or None)``."""
    from pytest_zero3.judging import RuleViolations

    generator = torch.Generator().manual_seed(1234 + scenario.rank())
    message = None
    try:
        with pytest_zero3.judge(engine, every=every) as judge:
            for _ in range(STEPS):
                ids = torch.randint(0, hf_models.VOCAB, (MICRO_BATCH, hf_models.SEQ), generator=generator)
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
    except RuleViolations as exc:
        message = str(exc)
    return judge, message


def judged_runs(spec: str, everies: tuple) -> list:
    """Under implementation ``spec``, one fresh engine per ``every``: the violations as tuples, the
    steps judged, the failure message."""
    impl.apply(impl.parse(spec))
    out = []
    for every in everies:
        engine = tiny_llama_engine()
        judge, message = train_judged(engine, every)
        engine.destroy()
        found = [(v.rule, v.step, v.event, v.module, v.param) for v in judge.violations]
        out.append({"violations": found, "judged": judge.steps_judged, "seen": judge.steps_seen, "message": message})
    return out


def mlp_judged(spec: str) -> list:
    """Linear layers with a bias under a prefetch bucket smaller than one weight: DeepSpeed's prefetch
    issues a module's weight and stops, and only a judge that orders a module's params by ``ds_id``
    (weight, then bias) as the trace does, not by name, agrees; the violations found."""
    import deepspeed

    impl.apply(impl.parse(spec))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "train_batch_size": MICRO_BATCH * scenario.world_size(),
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    with pytest_zero3.judge(engine, check=False) as judge:
        for _ in range(STEPS):
            engine.backward(engine(torch.randn(MICRO_BATCH, 64)).square().mean())
            engine.step()
    engine.destroy()
    return [str(v) for v in judge.violations]


def test_judge_is_silent_on_the_reference(zero3_world):
    for rank, (run,) in enumerate(zero3_world.run(judged_runs, "reference", (1,))):
        assert (run["seen"], run["judged"]) == (STEPS, STEPS), f"rank {rank}: {run}"
        assert run["violations"] == [], f"rank {rank}: the judge flags the reference:\n{run['message']}"
        assert run["message"] is None
    for rank, found in enumerate(zero3_world.run(mlp_judged, "reference")):
        assert found == [], f"rank {rank}: the judge flags the reference:\n" + "\n".join(found[:5])


def test_judge_flags_a_prefetch_bug_and_sampling_finds_the_same(zero3_world):
    """Why: the bug breaks no number, only the prefetch window (rule-d), which only the rules see."""
    for rank, (full, sampled) in enumerate(zero3_world.run(judged_runs, BAD, (1, 3))):
        prefetch = [v for v in full["violations"] if v[0] == "rule-d"]
        assert prefetch, f"rank {rank}: the prefetch bug was not flagged as rule-d: {full['violations'][:5]}"
        rule, step, event, module, param = prefetch[0]
        assert step == 1, f"rank {rank}: prefetch follows a complete trace from step 1 on, flagged at {step}"
        assert event >= 0 and param.startswith("model.layers."), prefetch[0]
        named = [v for v in prefetch if v[3]]  # the root module's events name no module ("")
        assert named and all(v[3].startswith("model") for v in named), f"no module named: {prefetch[:5]}"
        message = full["message"] or ""
        assert "rule-d: step 1, event" in message and f"param {param!r}" in message, message
        assert "stage3_prefetch_bucket_size=1000" in message and "The rules broken:" in message, message
        # every=3 judges steps 0, 1 and 3 of 4, each against the trace state the skipped step 2 left
        assert (sampled["seen"], sampled["judged"]) == (STEPS, 3)
        on_judged = [v for v in full["violations"] if v[1] in (0, 1, 3)]
        assert sampled["violations"] == on_judged, f"rank {rank}: sampling changed the verdict on the steps it judged"
        assert any(v[1] == 3 for v in sampled["violations"]), "step 3 (after a skipped step) was not judged"


def example_on_reference(steps: int, every: int) -> tuple:
    impl.apply(impl.parse("reference"))
    import train_with_judge

    judge = train_with_judge.train(steps=steps, every=every)  # raises RuleViolations on any violation
    return judge.steps_seen, judge.steps_judged, len(judge.violations)


def test_training_example_runs_clean_on_the_reference(zero3_world, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # the ranks import it from the same path
    # every=2 over 5 steps judges steps 0, 1, 2 and 4
    assert zero3_world.run(example_on_reference, 5, 2) == [(5, 4, 0), (5, 4, 0)]
