"""Family 005: the DeepSpeed engine around the coordinator.

A fork ships the coordinator together with the hooks that drive it (``parameter_offload.py``),
partitioning and ``GatheredParameters`` (``partition_parameters.py``), the stage-3 gradient path
(``stage3.py``) and checkpoint conversion (``zero_to_fp32.py``).  Each contract drives one of those
paths in the forms real models and training loops use and compares with plain torch or with the
weights the run trained.  Scenarios, by surface: :mod:`pytest_zero3.fixtures.module_outputs` (005-a),
:mod:`pytest_zero3.fixtures.gathered_parameters` (005-b, 005-f), :mod:`pytest_zero3.fixtures.rewrap` (005-c),
:mod:`pytest_zero3.fixtures.gradient_path` (005-d), :mod:`pytest_zero3.fixtures.checkpoints` (005-e).

Oracle: the plain-torch twin of the effective config (``fixtures/twin.py``: precision, gradient
accumulation, clipping, the optimizer).  Tolerance: the baseline family's at fp32 (1e-5 relative,
1e-6 absolute, elementwise) on gradients, losses and weights, the dtype's under bf16/fp16; a hook that
does not fire or a misplaced partition moves a value by far more.
"""

import pytest
from pytest_zero3.fixtures import checkpoints, gradient_path, module_outputs, parity, rewrap, verdicts
from pytest_zero3.fixtures import gathered_parameters as gp
from pytest_zero3.fixtures.config import ABOVE_ANY_MODEL


@pytest.mark.zero3_contract("005-a")
def test_container_and_no_grad_outputs(zero3_world):
    """Models return tuples, lists, dicts, namedtuples, dataclasses and nests of them, and modules
    whose outputs need no grad (a frozen input layer, a gate computed under no_grad).  DeepSpeed
    must find every output tensor to hook its module's backward: a missed one leaves the module's
    params partitioned while autograd needs them, or gathered after backward."""
    variants = [(module_outputs.ContainerNet.KINDS, None), (module_outputs.ContainerNet.KINDS, parity.PREFETCH_ON)]
    results = zero3_world.run(module_outputs.container_runs, variants)
    verdicts.assert_clean(results, "container or no-grad outputs under ZeRO-3")


@pytest.mark.zero3_contract("005-b")
def test_gathered_parameters(zero3_world):
    """``GatheredParameters`` is how users read, initialise and edit ZeRO-3 weights: read-only, nested,
    and with ``modifier_rank`` (the last rank edits).  Each exit partitions the context's params again
    and leaves an enclosing context's params gathered; an edit is seen by every rank."""
    results = zero3_world.run(gp.gathered_parameters)
    verdicts.assert_clean(results, "GatheredParameters")


# FusedAdam built in the forkserver: the re-wrapped engine gets it on a base that pops torch_adam
@pytest.mark.zero3_preload("pytest_zero3.fixtures.fused_adam_op")
@pytest.mark.zero3_contract("005-c")
def test_engine_lifecycle_hooks(zero3_world):
    """Sweeps, notebooks and RL trainers wrap the same model several times and remove and re-add
    ZeRO-3's hooks around generation.  ``destroy()`` must remove every hook ZeRO-3 registered (module
    forward and backward hooks, each param's gradient-accumulation hook); a second wrap or a
    re-registration must register each hook once, so nothing fires twice, drop the trace recorded
    under the old hooks (DeepSpeed PR 8043), and train like plain torch.

    Not counted: the engine's own forward pre/post hooks on the root module (timers, forward
    prologue), which ``DeepSpeedEngine.destroy()`` does not remove in any release tested."""
    results = zero3_world.run(rewrap.lifecycle)
    verdicts.assert_clean(results, "engine lifecycle")


@pytest.mark.zero3_contract("005-d")
def test_gradient_path(zero3_world):
    """Every weight and bias of the model has an odd number of elements (uneven partitions), with
    two micro-batches per step, a reduce bucket smaller than one param (each gradient reduced alone)
    and one larger than the model (all reduced together)."""
    variants = [(10, 2), (ABOVE_ANY_MODEL, 2)]
    results = zero3_world.run(gradient_path.gradient_paths, variants)
    verdicts.assert_clean(results, "the stage-3 gradient path")


@pytest.mark.zero3_contract("005-e")
def test_conversions(zero3_world, tmp_path):
    """``zero_to_fp32`` and ``save_16bit_model`` rebuild full tensors from shards: with uneven
    partitions each shard carries padding that must be cut at the right place, a tied param appears
    under two names, and frozen params travel outside the optimizer."""
    results = zero3_world.run(checkpoints.conversions, str(tmp_path / "out"))
    verdicts.assert_clean(results, "checkpoint conversions")


@pytest.mark.zero3_contract("005-f")
def test_gathered_between_forward_and_backward(zero3_world):
    """Users read the weights between a forward and its backward (to log a norm) and generate inside a
    training step (``unwrap_model_for_generation``).  At that point the backward's first params are
    in flight (prefetch): the context must give them whole, with the weights of that step, and its exit
    must partition them again without breaking the backward that follows."""
    results = zero3_world.run(gp.gathered_between_forward_and_backward)
    verdicts.assert_clean(results, "GatheredParameters between forward and backward")
