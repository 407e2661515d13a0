"""Contract family ``fw``: the frameworks people train with drive the implementation under test.

Why: most ZeRO-3 training never calls ``deepspeed.initialize`` itself: transformers' ``Trainer``,
accelerate's ``Accelerator`` and TRL's trainers do, each in its own way (a scheduler given as a
callable, ``load_checkpoint`` as ``deepspeed_load_checkpoint`` calls it, the 16-bit consolidation with
``exclude_frozen_parameters`` for PEFT).  An imitation of those calls drifts when the framework or
the fork changes; these contracts run the real frameworks (:mod:`pytest_zero3.fixtures.frameworks`),
on tiny models built from configs in code, each against the same framework under DDP in the same
world.  A framework absent or too old makes its contracts unsupported with the reason.
"""

from __future__ import annotations

import pytest
from pytest_zero3.fixtures import frameworks as fw
from pytest_zero3.fixtures import verdicts


@pytest.mark.zero3_preload("transformers", "accelerate")
@pytest.mark.zero3_timeout(300)  # three Trainer runs, each compiled under the compile profile
@pytest.mark.zero3_contract("fw-a")
def test_trainer(zero3_world):
    """A user's ``Trainer`` run (``TrainingArguments(deepspeed=config)``, accumulation, clipping, a warm-up
    schedule, checkpoints, ``evaluate``, ``save_model``) must train as the same ``Trainer`` under DDP, and
    a run resumed from its checkpoint must continue as the uninterrupted one."""
    verdicts.assert_clean(zero3_world.run(fw.trainer_path), "the Trainer under ZeRO-3")


@pytest.mark.zero3_preload("transformers", "accelerate")
@pytest.mark.zero3_timeout(180)
@pytest.mark.zero3_contract("fw-b")
def test_accelerator(zero3_world):
    """A user's accelerate loop (``Accelerator(deepspeed_plugin=...)``, the user's AdamW and warm-up
    scheduler, ``accumulate``, gradient clipping, ``save_state``, ``get_state_dict``) must train as the
    same loop under DDP, and ``load_state`` must continue it as if never stopped."""
    verdicts.assert_clean(zero3_world.run(fw.accelerate_path), "accelerate's loop under ZeRO-3")


@pytest.mark.zero3_preload("transformers", "accelerate", "peft")
@pytest.mark.zero3_timeout(300)  # three Trainer runs, each compiled under the compile profile
@pytest.mark.zero3_contract("fw-c")
def test_trainer_peft(zero3_world):
    """A PEFT LoRA fine-tune in the ``Trainer`` (gradient checkpointing, ``save_model`` of the adapters,
    checkpoints without the frozen base) must train the adapters as under DDP, leave the base as loaded,
    and resume from its checkpoint as the uninterrupted run."""
    verdicts.assert_clean(zero3_world.run(fw.peft_path), "a PEFT fine-tune in the Trainer under ZeRO-3")


@pytest.mark.zero3_preload("transformers", "accelerate", "trl")
@pytest.mark.zero3_timeout(180)
@pytest.mark.zero3_contract("fw-d")
def test_trl_reference_model(zero3_world):
    """TRL's frozen reference model (``prepare_deepspeed``: its own engine, no optimizer, ``eval()``) must
    score as plain torch on the source weights and stay as loaded while a DPO-style policy trains beside
    it, and the policy must train as under DDP."""
    verdicts.assert_clean(zero3_world.run(fw.reference_path), "TRL's reference model under ZeRO-3")
