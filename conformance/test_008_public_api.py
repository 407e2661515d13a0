"""Family 008: the public API around a ZeRO-3 step (tensor-fragment reads and writes, the global norm).

Trainers call these between backward and step: HF's Trainer logs ``get_global_grad_norm()``, RL and
distillation code reads full gradients, model surgery writes fp32 masters and optimizer states.  Each
value returned is compared with the plain-torch twin's, and each write is made on both sides, under
HF-style param groups, accumulation and clipping, with the optimizer on the device and offloaded (one
test each: a failure of one does not hide the other).
Scenarios, by surface (modules of :mod:`pytest_zero3.fixtures`): ``tensor_fragments`` (008-a, 008-b),
``offload_states`` (008-c), ``checkpoints`` (008-d, 008-i), ``copies`` (008-e), ``config_keys`` (008-f, 008-h),
``training_loop`` (008-g, 008-m), ``zero_init`` (008-j), ``leaves`` (008-k), ``initialize`` (008-l); what they
share is :mod:`pytest_zero3.fixtures.user_script`.
"""

import pytest
from pytest_zero3.conformance.conftest import CPU_ADAM_PRELOAD as CPU_ADAM
from pytest_zero3.fixtures import (
    checkpoints,
    config_keys,
    copies,
    initialize,
    leaves,
    offload_states,
    tensor_fragments,
    training_loop,
    verdicts,
    zero_init,
)

#: builds DeepSpeed's FusedAdam op in the forkserver, whatever the release (fixtures/fused_adam_build.py)
FUSED_ADAM = "pytest_zero3.fixtures.fused_adam_build"
#: The variants of 008-a/008-b; the offloaded one steps DeepSpeedCPUAdam, built in the forkserver, never
#: inside a scenario's timeout (only there: a fork builds it anew, minutes on 2 cores)
VARIANTS = [
    pytest.param(name, marks=[pytest.mark.zero3_preload(CPU_ADAM)] if zero else [])
    for name, zero in tensor_fragments.VARIANTS.items()
]


@pytest.mark.zero3_contract("008-a")
@pytest.mark.parametrize("variant", VARIANTS)
def test_fragment_reads_equal_the_twin(zero3_world, variant):
    """After every backward: ``safe_get_full_grad`` and ``safe_get_local_grad`` (this rank's slice of
    the accumulated gradient); after every step: ``get_global_grad_norm()`` (the norm before clipping,
    the norm torch's clipping returns), the fp32 masters and Adam's moments, full and local."""
    verdicts.assert_clean(
        zero3_world.run(tensor_fragments.fragment_api, variant, False), f"tensor-fragment reads ({variant})"
    )


@pytest.mark.zero3_contract("008-b")
@pytest.mark.parametrize("variant", VARIANTS)
def test_fragment_writes_train_like_the_twin(zero3_world, variant):
    """``safe_set_full_grad``, ``safe_set_local_grad``, ``safe_set_full_fp32_param`` and
    ``safe_set_full_optimizer_state`` between the last backward of a step and the step: the step
    clips by the norm of the gradients as written and starts from the written master and moments;
    every later read and the final weights equal the twin's that made the same writes."""
    verdicts.assert_clean(
        zero3_world.run(tensor_fragments.fragment_api, variant, True), f"tensor-fragment writes ({variant})"
    )


@pytest.mark.zero3_contract("008-b")
@pytest.mark.parametrize(
    "variant",
    [pytest.param(f"vectorized-{v.values[0]}", marks=v.marks) for v in VARIANTS],
)
def test_vectorized_grad_update_trains_like_the_twin(zero3_world, variant):
    """``safe_update_full_grad_vectorized`` rescaling the gradients of an odd-sized param and another
    between the last backward of a step and the step, on both sides: the step and every later read
    equal the twin's.  Its own test: a bug inside its sequence of all-gathers can take the world down."""
    base = variant.split("-", 1)[1]
    verdicts.assert_clean(
        zero3_world.run(tensor_fragments.fragment_api, base, "vectorized"), f"vectorized gradient update ({base})"
    )


# FusedAdam (offload_states asserts it) built in the forkserver, DeepSpeedCPUAdam where a drawn config
# offloads the optimizer
@pytest.mark.zero3_preload(FUSED_ADAM, CPU_ADAM)
@pytest.mark.zero3_contract("008-c")
@pytest.mark.parametrize("kind", tuple(offload_states.OFFLOADS))
def test_offload_states_round_trip(zero3_world, kind):
    """RL trainers offload the engine's states around generation and reload them for the next step:
    after the round trip every fp32 master and Adam moment is the twin's and training goes on like
    the twin's, which never moved anything; while offloaded, each moved kind is on the host."""
    verdicts.assert_clean(
        zero3_world.run(offload_states.offload_round_trip, kind), f"offload_states round trip ({kind})"
    )


@pytest.mark.zero3_contract("008-d")
@pytest.mark.parametrize("variant", ("full", "module-only"))
def test_checkpoint_load_options(zero3_world, tmp_path, variant):
    """``load_optimizer_states`` True and False, with and without ``load_module_only``: the trained
    weights are loaded into a fresh engine, and training goes on like a twin that restored the same
    things: Adam's moments only where the optimizer states are loaded and not module only (a fresh
    AdamW otherwise, unlike a torch resume of the whole optimizer)."""
    results = zero3_world.run(checkpoints.checkpoint_loads, str(tmp_path / "ckpt"), variant == "module-only")
    verdicts.assert_clean(results, f"load_checkpoint options ({variant})")


@pytest.mark.zero3_contract("008-e")
@pytest.mark.parametrize("variant", copies.COPIES)
def test_copy_of_wrapped_model(zero3_world, variant):
    """EMA and reference-model code copies the model it trains: ``copy.deepcopy(engine.module)`` and a
    pickle round trip either raise at the call or give what plain torch gives (the full trained
    weights, the twin's forward); the original trains on like the twin either way."""
    verdicts.assert_clean(zero3_world.run(copies.copy_of_wrapped, variant), f"{variant} of the wrapped model")


@pytest.mark.zero3_contract("008-f")
@pytest.mark.parametrize("variant", config_keys.EDGE_VARIANTS)
def test_size_keys_at_the_model_boundaries(zero3_world, variant):
    """Config sizes land exactly on a param's numel in real configs (HF's ``"auto"`` values are computed
    from the hidden size): every size key of the implementation at each boundary of the model (each
    param's numel, one less, one more, the model's total, above it), params smaller than the world
    size and of odd numel, and a 0-dim param (its own test: one failure does not hide the other)."""
    verdicts.assert_clean(zero3_world.run(config_keys.edge_sizes, variant), f"edge sizes ({variant})")


@pytest.mark.zero3_contract("008-g")
@pytest.mark.parametrize("variant", tuple(training_loop.LOOP_FORMS))
def test_loop_forms_train_like_the_twin(zero3_world, variant):
    """Training loops call more than ``engine.backward(loss); engine.step()``: ``loss.backward()`` and
    ``engine.scale(loss).backward()`` directly, ``backward(scale_wrt_gas=False)`` on a loss scaled by
    hand, ``retain_graph`` for a second backward through one forward, the boundary set by hand
    (``set_gradient_accumulation_boundary``), a window's reductions coalesced, the boundary owned by
    ``step()`` (``managed_gradient_accumulation: false``), DDP's ``no_sync`` (stage 3 may refuse it at
    the call), ``zero_grad()`` after each step.  Each form trains like the twin that takes the same
    windows (one test each: one form's failure hides no other)."""
    verdicts.assert_clean(zero3_world.run(training_loop.loop_form, variant), f"the {variant} form of the training loop")


@pytest.mark.zero3_contract("008-h")
@pytest.mark.parametrize("variant", tuple(config_keys.CONFIG_KEYS))
def test_config_keys_train_like_the_twin(zero3_world, variant):
    """The config keys beside ``zero_optimization`` that change how stage 3 scales, reduces or rounds the
    gradients or casts the forward (``communication_data_type``, ``prescale_gradients``,
    ``gradient_predivide_factor``, ``gradient_allreduce_op``, ``torch_autocast`` and its safe modules,
    ``data_types``): each trains like the twin built from the same config, within the rounding of the
    dtypes it names; ``gradient_allreduce_op: sum`` may be refused at initialize, naming the key."""
    verdicts.assert_clean(zero3_world.run(config_keys.config_key, variant), f"the config key {variant}")


@pytest.mark.zero3_contract("008-i")
@pytest.mark.parametrize("variant", checkpoints.CHECKPOINT_VARIANTS)
def test_checkpoint_options_round_trip(zero3_world, tmp_path, variant):
    """``save_checkpoint``'s ``client_state``, ``save_latest`` and ``exclude_frozen_parameters``,
    ``save_16bit_model``'s ``save_filename`` and ``exclude_frozen_parameters``, and every converter of
    ``zero_to_fp32`` with its options (lazy, sharded safetensors, bf16 output, frozen params left out):
    what each gives back is the twin's, a frozen param is left out exactly where asked, and an engine
    that loads it trains on like the twin that restored the same."""
    world = zero3_world.resized(checkpoints.NODES_WORLD) if variant == "use_node_local_storage" else zero3_world
    results = world.run(checkpoints.checkpoint_options, variant, str(tmp_path / "ckpt"))
    verdicts.assert_clean(results, f"checkpoint options ({variant})")


@pytest.mark.zero3_contract("008-j")
@pytest.mark.parametrize(
    "variant",
    zero_init.INIT_VARIANTS + tuple(zero_init.OVERRIDE_VARIANTS) + zero_init.GATHER_VARIANTS + zero_init.TILED_VARIANTS,
)
def test_init_and_gather_options_train_like_the_twin(zero3_world, variant):
    """``zero.Init``'s options (an already built ``module``, ``enabled=False``, ``remote_device`` with
    ``pin_memory``, a ``data_parallel_group``, ``mem_efficient_linear=False``, ``tensor_overrides``: the
    dtype of the tensors its constructors make), a weight used outside its
    module registered with ``register_external_parameter``, and ``GatheredParameters(enabled=False)``:
    each model partitions as the option says and trains like the twin built plainly."""
    world = zero3_world.resized(zero_init.HPZ_RANKS) if variant == "zero_param_parallel_group" else zero3_world
    verdicts.assert_clean(world.run(zero_init.init_option, variant), f"zero.Init / GatheredParameters ({variant})")


@pytest.mark.zero3_contract("008-k")
@pytest.mark.parametrize("variant", leaves.LEAF_VARIANTS)
def test_leaf_helpers_train_like_the_twin(zero3_world, variant):
    """MoE and custom-kernel code flags modules ZeRO-3 gathers whole: by name, by name suffix, by class
    and unflagged again, or by a class the model lacks (raising unless told not to).  The helpers report
    exactly the flags set (``get_z3_leaf_modules``, ``z3_leaf_parameter``) and the model trains like
    the twin."""
    verdicts.assert_clean(zero3_world.run(leaves.leaf_helpers, variant), f"z3 leaf helpers ({variant})")


@pytest.mark.zero3_contract("008-l")
@pytest.mark.parametrize("variant", initialize.CLIENT_VARIANTS)
def test_user_optimizer_and_scheduler_train_like_the_twin(zero3_world, variant):
    """HF's Trainer hands ``deepspeed.initialize`` its own optimizer and scheduler when the config names
    none: an optimizer instance or callable, torch's LambdaLR or a scheduler callable, and under
    ``offload_optimizer`` the key that lets a torch optimizer step the host partitions
    (``zero_force_ds_cpu_optimizer: false``; true refuses at initialize, naming it).  Each trains like
    the twin built with the same factories."""
    verdicts.assert_clean(
        zero3_world.run(initialize.client_objects, variant), f"the user's optimizer and scheduler ({variant})"
    )


@pytest.mark.zero3_contract("008-m")
def test_compiled_autograd_trains_like_the_twin(zero3_world):
    """``engine.compile(compiled_autograd_enabled=True)``: compiled autograd captures each backward into a
    graph whose nodes call stage 3's gradient hooks; training goes on like the twin, and the params are
    released after the step.  Under ``fp32`` the captured graph runs as captured (torch.compile disabled);
    under ``compile`` dynamo traces it with the profile's backend, around the hooks."""
    verdicts.assert_clean(zero3_world.run(training_loop.compiled_autograd), "compiled autograd")
