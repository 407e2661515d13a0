"""Family 007: the model's life around the engine, as the ecosystem lives it.

Users attach modules after ``deepspeed.initialize``, load checkpoints with transformers'
``from_pretrained`` while ZeRO-3 is active, add PEFT adapters to a bf16 base and train under autocast,
build models from class hierarchies of their own, and resize embeddings or assign params after
``initialize``.  Each contract takes one of those paths with the libraries' own entry points and
judges it by parity with a plain-torch twin (losses, every trainable param's gradient after every
backward, final weights) and (007-a to 007-c) by the rule model over every hook event; a change the
engine cannot honour may instead be refused by an error that says what to do (007-d).
Scenarios: :mod:`pytest_zero3.fixtures.model_life`.
"""

import pytest
from pytest_zero3.fixtures import model_life as f7
from pytest_zero3.fixtures.verdicts import assert_clean


@pytest.mark.zero3_contract("007-a")
def test_module_attached_after_initialize(zero3_world):
    """A module attached after ``deepspeed.initialize`` (a value head, an adapter) is a plain torch
    module: DeepSpeed converted nothing of it and hooks nothing of it, and its forward runs inside a
    hooked module's.  DeepSpeed's own unit test (``test_zero_late_module_attach.py``, issue 6961)
    checks only that the first forward does not crash; this contract trains through it: every step
    after the attach, the coordinator's fetches, releases and step-boundary clean-up must leave the
    plain params alone and train the rest like plain torch."""
    assert_clean(zero3_world.run(f7.late_attach), "a module attached after deepspeed.initialize")


@pytest.mark.zero3_preload("transformers")
@pytest.mark.zero3_contract("007-b")
def test_from_pretrained_policy_and_reference(zero3_world, tmp_path):
    """How transformers and TRL load a model under ZeRO-3: with ``HfDeepSpeedConfig`` alive,
    ``from_pretrained`` builds the model under ``deepspeed.zero.Init`` and rank 0 loads each module's
    weights inside ``GatheredParameters(modifier_rank=0)``; TRL then loads the reference model the same
    way a second time and wraps it in a frozen evaluation engine.  The class is
    ``LlamaForSequenceClassification``, which has no ``__init__`` of its own and a non-Module mixin first
    among its bases: DeepSpeed before 0.17.6 (PR 7566) restored the wrong ``__init__`` on it when a ``zero.Init``
    context closed, so the second load built a model without its layers."""
    results = zero3_world.run(f7.from_pretrained_pair, str(tmp_path / "checkpoint"))
    assert_clean(results, "from_pretrained under ZeRO-3 (policy and reference copy)")


@pytest.mark.zero3_preload("transformers", "peft")
@pytest.mark.zero3_contract("007-c")
def test_peft_lora_bf16_base_under_autocast(zero3_world):
    """PEFT fine-tuning as TRL and transformers set it up: a bf16 base, LoRA adapters that PEFT keeps in
    fp32, the head in ``modules_to_save`` (a ``ModulesToSaveWrapper``, which delegates unknown
    attributes to the module it wraps: DeepSpeed before 0.19.3 gave it its child's backward-hook state and
    raised ``AttributeError: ... 'ds_grads_remaining'``, issues 7203 and 7615, PR 8144), the forward
    under bf16 autocast."""
    assert_clean(zero3_world.run(f7.peft_lora_bf16), "PEFT LoRA on a bf16 base under autocast")


@pytest.mark.zero3_preload("transformers")
@pytest.mark.zero3_contract("007-d")
def test_param_replaced_after_initialize(zero3_world):
    """DeepSpeed converts a model's params once, at ``deepspeed.initialize``.  A param set on a hooked
    module after it (transformers' ``resize_token_embeddings`` under ZeRO-3, a new ``nn.Parameter``
    assigned to a weight) is a plain tensor the optimizer does not hold; stock 0.19.8 then crashes at the
    next forward on a missing attribute (``'Parameter' object has no attribute 'ds_id'`` or
    ``'ds_status'``) that says nothing of the change.  What a user must get instead: training like plain
    torch with the optimizer built before the change, or a refusal that names the module and the param
    and says to make the change before ``deepspeed.initialize``; never different weights in silence."""
    assert_clean(zero3_world.run(f7.replaced_param), "a param replaced after deepspeed.initialize")


@pytest.mark.zero3_contract("007-e")
def test_saved_mid_training_and_resumed(zero3_world, tmp_path):
    """What a training run saves, and trains on from: the consolidated state dict (``save_16bit_model``,
    transformers' Trainer), ``save_checkpoint`` and its ``zero_to_fp32`` recovery, taken between steps,
    of a model with a tied head, buffers and a frozen layer; then training goes on in the same engine
    and in a fresh one that loaded the checkpoint."""
    results = zero3_world.run(f7.save_and_resume, str(tmp_path / "checkpoint"))
    assert_clean(results, "saved mid-training and resumed")
