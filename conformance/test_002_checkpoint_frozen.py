"""Contract family 002: activation-checkpoint recompute with frozen parameters (DeepSpeed PR 8130/8148).

ZeRO-3 + ``torch.utils.checkpoint(use_reentrant=False)`` (the transformers/TRL default) + frozen
params (LoRA, a quantized base): the recompute re-fires ZeRO's forward hooks inside backward.  A
coordinator that partitions a frozen param there shrinks a tensor checkpoint still holds, and
backward dies with ``CheckpointError`` (deepspeed <= 0.19.2).  A fixed coordinator must also release
what the recompute gathered even when the block never gets its post-backward hook (no-grad input),
and must not partition a module's params under its own running backward when the recompute runs
the whole block (checkpoint early-stop off).

Every scenario is in :mod:`pytest_zero3.fixtures.recompute_frozen`; each also counts forward calls that ran inside
backward, so a contract cannot pass because checkpointing silently did not recompute.
"""

import importlib.util

import pytest
from pytest_zero3.fixtures import recompute_frozen as f002
from pytest_zero3.fixtures.models.checkpointed import NON_REENTRANT, REENTRANT
from pytest_zero3.fixtures.verdicts import assert_clean


def _judged(results, *checks):
    """Each rank's problems: every check (a function of that rank's result) in order."""
    return [[line for check in checks for line in check(result)] for result in results]


def _recomputed(result):
    return f002.recompute_problems(result)


def _finite(result):
    return f002.finite_problems(result["losses"])


@pytest.mark.zero3_contract("002-a")
def test_frozen_params_survive_non_reentrant_recompute(zero3_world):
    """The PR 8130 MRE: a recompute must see the frozen LayerNorm weight/bias at the shape checkpoint saved."""
    results = zero3_world.run(f002.checkpoint_training, NON_REENTRANT, frozen=("norm",), steps=4)
    froze = lambda r: [] if r["frozen"] else ["the scenario froze nothing"]  # noqa: E731
    assert_clean(_judged(results, _recomputed, froze, _finite), "checkpointed training with frozen norms")


@pytest.mark.parametrize("gas", [1, 2], ids=["gas1", "gas2"])
@pytest.mark.zero3_contract("002-b")
def test_everything_released_after_each_backward(zero3_world, gas):
    """Frozen params the recompute gathered belong to the backward that needed them: released with it."""
    results = zero3_world.run(f002.checkpoint_training, NON_REENTRANT, frozen=("norm",), steps=2, gas=gas)
    assert_clean(_judged(results, _recomputed, f002.released_problems), "state not released after backward")


@pytest.mark.zero3_contract("002-c")
def test_no_grad_block_input_released_across_micro_batches(zero3_world):
    """The PR 8130 review case: such a block never gets its post-backward hook, so the recompute's
    gathers must be released at the end of backward, not left until the optimizer step."""
    results = zero3_world.run(f002.checkpoint_training, NON_REENTRANT, frozen=("stem", "norm"), steps=2, gas=2)
    assert_clean(_judged(results, _recomputed, f002.released_problems), "state not released after backward")


@pytest.mark.zero3_contract("002-d")
def test_reentrant_checkpointing_keeps_working(zero3_world):
    """The fix for the non-reentrant path must not break the reentrant one (its recompute runs in a
    nested backward, also with a graph task id)."""
    results = zero3_world.run(f002.checkpoint_training, REENTRANT, frozen=("norm",), steps=4)
    assert_clean(_judged(results, _recomputed, _finite, f002.released_problems), "state not released after backward")


@pytest.mark.zero3_preload("transformers", "peft")
@pytest.mark.zero3_timeout(240)
@pytest.mark.zero3_contract("002-e")
def test_hf_llama_lora_gradient_checkpointing(zero3_world):
    """The real case behind the bug reports: transformers + peft, built from a config (nothing downloaded)."""
    missing = [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"002-e needs {' and '.join(missing)} installed (pip install 'transformers>=5' peft)")
    results = zero3_world.run(f002.lora_llama_training, steps=3)

    def lora(r):
        ok = any("lora_" in n for n in r["trainable"]) and not any("lora_" in n for n in r["frozen"])
        return [] if ok else [f"LoRA adapter not set up as expected: trainable={r['trainable']}"]

    def down(r):
        losses = r["losses"]
        if losses[-1] < losses[0]:
            return []
        return [f"loss did not go down over {len(losses)} optimizer steps on a fixed batch: {losses}"]

    recomputed = lambda r: f002.recompute_problems(r, "LoRA-wrapped attention projections")  # noqa: E731
    assert_clean(_judged(results, recomputed, lora, _finite, down, f002.released_problems), "tiny Llama + LoRA")


@pytest.mark.zero3_contract("002-f")
def test_checkpointed_run_matches_unchecked_and_plain_torch(zero3_world):
    """Recompute must run on the same full weights as the forward: any difference is a wrong gather."""
    assert_clean(zero3_world.run(f002.parity, steps=3), "checkpointed ZeRO-3 against the unchecked run and the twin")


@pytest.mark.parametrize("frozen", [(), ("norm",)], ids=["all-trainable", "frozen-norms"])
@pytest.mark.zero3_contract("002-g")
def test_recompute_without_early_stop(zero3_world, frozen):
    """A full-block recompute re-runs the post-hook of the module whose backward is about to use its
    params: partitioning them there breaks AccumulateGrad ("size of tensor a (0) must match ...")."""
    results = zero3_world.run(f002.checkpoint_training, NON_REENTRANT, frozen=frozen, steps=3, gas=2, early_stop=False)
    assert_clean(_judged(results, _recomputed, _finite, f002.released_problems), "state not released after backward")
