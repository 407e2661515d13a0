"""Contract family 002: activation-checkpoint recompute with frozen parameters (DeepSpeed PR 8130/8148).

ZeRO-3 + ``torch.utils.checkpoint(use_reentrant=False)`` (the transformers/TRL default) + frozen
params (LoRA, a quantized base): the recompute re-fires ZeRO's forward hooks inside backward.  A
coordinator that partitions a frozen param there shrinks a tensor checkpoint still holds, and
backward dies with ``CheckpointError`` (deepspeed <= 0.19.2).  A fixed coordinator must also release
what the recompute gathered even when the block never gets its post-backward hook (no-grad input),
and must not partition a module's params under its own running backward when the recompute runs
the whole block (checkpoint early-stop off).

Every scenario is in :mod:`pytest_zero3.fixtures.family_002`; each also counts forward calls that ran inside
backward, so a contract cannot pass because checkpointing silently did not recompute.
"""

import importlib.util
import math

import pytest
from pytest_zero3.fixtures import family_002 as f002
from pytest_zero3.fixtures import profiles


def _assert_recomputed(result, what="checkpointed modules"):
    assert result["recomputes"] > 0, (
        f"no forward of the {what} ran inside backward: checkpointing did not recompute, so this "
        "scenario proves nothing (is the model in train mode, is checkpointing enabled?)"
    )


def _assert_clean_after_backward(result):
    dirty = [(step, micro, v) for step, micro, v in result["violations"] if v]
    assert not dirty, "state not released after backward:\n" + "\n".join(
        f"  step {step} micro-batch {micro}: " + "; ".join(v) for step, micro, v in dirty
    )


def _assert_finite(losses):
    assert all(math.isfinite(x) for x in losses), f"non-finite loss: {losses}"


@pytest.mark.zero3_contract("002-a")
def test_frozen_params_survive_non_reentrant_recompute(zero3_world):
    """The PR 8130 MRE: a recompute must see the frozen LayerNorm weight/bias at the shape checkpoint saved."""
    result = zero3_world.run(f002.checkpoint_training, f002.NON_REENTRANT, frozen=("norm",), steps=4)[0]
    _assert_recomputed(result)
    assert result["frozen"], "the scenario froze nothing"
    _assert_finite(result["losses"])


@pytest.mark.parametrize("gas", [1, 2], ids=["gas1", "gas2"])
@pytest.mark.zero3_contract("002-b")
def test_everything_released_after_each_backward(zero3_world, gas):
    """Frozen params the recompute gathered belong to the backward that needed them: released with it."""
    result = zero3_world.run(f002.checkpoint_training, f002.NON_REENTRANT, frozen=("norm",), steps=2, gas=gas)[0]
    _assert_recomputed(result)
    _assert_clean_after_backward(result)


@pytest.mark.zero3_contract("002-c")
def test_no_grad_block_input_released_across_micro_batches(zero3_world):
    """The PR 8130 review case: such a block never gets its post-backward hook, so the recompute's
    gathers must be released at the end of backward, not left until the optimizer step."""
    result = zero3_world.run(f002.checkpoint_training, f002.NON_REENTRANT, frozen=("stem", "norm"), steps=2, gas=2)[0]
    _assert_recomputed(result)
    _assert_clean_after_backward(result)


@pytest.mark.zero3_contract("002-d")
def test_reentrant_checkpointing_keeps_working(zero3_world):
    """The fix for the non-reentrant path must not break the reentrant one (its recompute runs in a
    nested backward, also with a graph task id)."""
    result = zero3_world.run(f002.checkpoint_training, f002.REENTRANT, frozen=("norm",), steps=4)[0]
    _assert_recomputed(result)
    _assert_finite(result["losses"])
    _assert_clean_after_backward(result)


@pytest.mark.zero3_preload("transformers", "peft")
@pytest.mark.zero3_timeout(240)
@pytest.mark.zero3_contract("002-e")
def test_hf_llama_lora_gradient_checkpointing(zero3_world):
    """The real case behind the bug reports: transformers + peft, built from a config (nothing downloaded)."""
    missing = [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"002-e needs {' and '.join(missing)} installed (pip install 'transformers>=5' peft)")
    result = zero3_world.run(f002.lora_llama_training, steps=3)[0]
    _assert_recomputed(result, "LoRA-wrapped attention projections")
    assert any("lora_" in n for n in result["trainable"]) and not any("lora_" in n for n in result["frozen"]), (
        f"LoRA adapter not set up as expected: trainable={result['trainable']}"
    )
    losses = result["losses"]
    _assert_finite(losses)
    assert losses[-1] < losses[0], f"loss did not go down over {len(losses)} steps on a fixed batch: {losses}"
    _assert_clean_after_backward(result)


@pytest.mark.zero3_contract("002-f")
def test_checkpointed_run_matches_unchecked_and_plain_torch(zero3_world):
    """Recompute must run on the same full weights as the forward: any difference is a wrong gather."""
    import torch

    out = zero3_world.run(f002.parity, steps=3)[0]
    ckpt, unchecked, plain = out["checkpointed"], out["unchecked"], out["torch"]
    _assert_recomputed(ckpt)
    assert unchecked["recomputes"] == 0
    diffs = [abs(a - b) for a, b in zip(ckpt["losses"], unchecked["losses"])]
    assert max(diffs) <= 1e-6 * max(1.0, max(map(abs, unchecked["losses"]))), (
        f"checkpointed losses {ckpt['losses']} differ from unchecked {unchecked['losses']} (max diff {max(diffs):.3g})"
    )
    assert len(ckpt["grads"]) == len(plain["grads"]) == 3
    bad = []
    for step, (z3, ref) in enumerate(zip(ckpt["grads"], plain["grads"])):
        assert sorted(z3) == sorted(ref), f"trainable params differ: ZeRO-3 {sorted(z3)} vs torch {sorted(ref)}"
        for name, g in z3.items():
            if g is None:
                bad.append(f"step {step} {name}: ZeRO-3 has no gradient")
                continue
            err = (g - ref[name]).abs().max().item()
            rtol, atol = profiles.tolerance((1e-4, 1e-5))  # bf16/fp16 configs: the dtype's
            tol = atol + rtol * ref[name].abs().max().item()
            if not torch.isfinite(g).all() or err > tol:
                bad.append(f"step {step} {name}: max |ZeRO-3 - torch| = {err:.3g} > {tol:.3g}")
    assert not bad, "checkpointed ZeRO-3 gradients differ from plain torch:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("frozen", [(), ("norm",)], ids=["all-trainable", "frozen-norms"])
@pytest.mark.zero3_contract("002-g")
def test_recompute_without_early_stop(zero3_world, frozen):
    """A full-block recompute re-runs the post-hook of the module whose backward is about to use its
    params: partitioning them there breaks AccumulateGrad ("size of tensor a (0) must match ...")."""
    result = zero3_world.run(
        f002.checkpoint_training, f002.NON_REENTRANT, frozen=frozen, steps=3, gas=2, early_stop=False
    )[0]
    _assert_recomputed(result)
    _assert_finite(result["losses"])
    _assert_clean_after_backward(result)
