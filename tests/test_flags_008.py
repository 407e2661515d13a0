"""Family 008's contracts flag each of stock 0.19.8's tensor-fragment bugs, one at a time.

Stock 0.19.8 has three (``reference_impl/fragments.py``, docs/results/bugs.md): full writes raise on a
param whose size does not divide by the world size, offloaded reads and writes between micro-batches
reach the host copy of the last boundary's gradients, and ``safe_set_full_grad`` under an offloaded
optimizer leaves the clipping norm of the gradient it replaced.  Each fork here is stock with the
three fixed in DeepSpeed's own source but one: 008 must fail on the one left and pass with none left,
so each contract is proven by the bug it names, not by whichever of stock's bugs comes first.
"""

import pytest

from conftest import ROOT  # at import: a whole-suite run in this process imports another conftest

STAGE3 = "runtime/zero/stage3.py"
#: Reads and writes between the micro-batches of an offloaded step go to the device partition.
FIX_READS = (
    STAGE3,
    "        group_idx, dest_offset, num_elements = self.grad_position[self.get_param_id(param)]\n"
    "        if self.offload_optimizer:\n"
    "            if self._swappable_optimizer_subgroup(group_idx):",
    "        group_idx, dest_offset, num_elements = self.grad_position[self.get_param_id(param)]\n"
    "        if self.offload_optimizer and not self.is_gradient_accumulation_boundary():\n"
    "            fp32_grad = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition[param.ds_id]\n"
    "            fp32_grad = fp32_grad.narrow(0, 0, param.ds_tensor.ds_numel)\n"
    "        elif self.offload_optimizer:\n"
    "            if self._swappable_optimizer_subgroup(group_idx):",
)
#: A full write pads the value before it cuts this rank's slice (both full setters).
FIX_PAD = [
    (
        STAGE3,
        "        value_partition = value.flatten().narrow(0, fp32_grad.numel() * my_rank, fp32_grad.numel())",
        "        value_partition = torch.nn.functional.pad(value.flatten(), (0, fp32_grad.numel() * (my_rank + 1)))"
        ".narrow(0, fp32_grad.numel() * my_rank, fp32_grad.numel())",
    ),
    (
        STAGE3,
        "        value_partition = value.flatten().narrow(0,\n"
        "                                                 fp32_opt_state_partition.numel() * my_rank,",
        "        value_partition = torch.nn.functional.pad(value.flatten(), (0, fp32_opt_state_partition.numel() * "
        "(my_rank + 1))).narrow(0,\n"
        "                                                 fp32_opt_state_partition.numel() * my_rank,",
    ),
]
#: ``safe_set_full_grad`` refreshes the written param's norm for clipping, as ``safe_set_local_grad`` does.
FIX_NORM = (
    STAGE3,
    "        fp32_grad.data.copy_(value_partition.data)\n",
    "        if self.offload_optimizer:\n"
    "            self.norm_for_param_grads[self.get_param_id(param)] = self._constant_buffered_norm2(value_partition)\n"
    "        fp32_grad.data.copy_(value_partition.data)\n",
)
FIXES = {"reads": [FIX_READS], "pad": FIX_PAD, "norm": [FIX_NORM]}
#: fork (the fix left out) -> (test of 008 that must fail, a line its message must show)
LEFT_OUT = {
    "reads": ("test_contract[008-a-offload]", "micro-batch 0: gradient of"),
    "pad": ("test_contract[008-b-device]", "raised RuntimeError"),
    "norm": ("test_contract[008-b-offload]", "engine.get_global_grad_norm()"),
}
#: fork -> the other tests the same bug fails: the reads fix is also where offloaded writes between
#: micro-batches land, and the unpadded cut is the same code whether the optimizer is offloaded or not.
ALSO_FAILS = {
    "reads": {"test_contract[008-b-offload]"},
    "pad": {"test_contract[008-b-offload]"},
    "norm": set(),
}
#: Failed on every fork here: ``safe_update_full_grad_vectorized`` cuts the unpadded slice at a site of its
#: own (DeepSpeed bug 10's other site, listed in 0.19.8's expectations), which none of :data:`FIXES` edits.
VECTORIZED = {
    "test_contract[008-b-vectorized-device]",
    "test_contract[008-b-vectorized-offload]",
}


@pytest.fixture(scope="module")
def fragment_fork(tmp_path_factory):
    """``fragment_fork(name)``: stock with every fix of :data:`FIXES` but ``name`` ("" : all of them)."""
    from forks import ForkCache

    edits = {left: [e for name, fix in FIXES.items() if name != left for e in fix] for left in [*FIXES, ""]}
    return ForkCache(tmp_path_factory, edits)


def _failed(run) -> set:
    """The tests of the run that failed, by name (pytest's short summary)."""
    import re

    return set(re.findall(r"^FAILED \S+::(\S+)", run.stdout, re.M))


def test_stock_fails_the_writes_for_the_padding(run_suite):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run):
    stock 0.19.8 is the fork with all three bugs, and its device writes fail 008-b naming the raise of
    the unpadded slice.  Each bug alone, on forks of stock with the other two fixed, is the proof run's
    (a fork builds DeepSpeed's CPU ops anew: about a minute each on 2 cores)."""
    test, says = LEFT_OUT["pad"]
    run = run_suite("installed", "008-b", "-k", "device")
    assert run.returncode == 1 and says in run.stdout and test in run.stdout, run.stdout[-4000:]


@pytest.mark.proof
@pytest.mark.parametrize("left", [*FIXES, ""], ids=lambda n: f"without-{n}" if n else "all-fixed")
def test_each_fragment_bug_alone_fails_its_test(run_suite, fragment_fork, left):
    """Why: with all three fixed in DeepSpeed's own source 008's fragment tests pass (the contracts judge
    the API, not the reference's way of fixing it); with one left out exactly that one's tests fail.  The
    vectorized update fails on every one of these forks, by stock's bug at its own site (:data:`VECTORIZED`)."""
    run = run_suite(fragment_fork(left), "008-a,008-b")
    failed = _failed(run)
    want = ({LEFT_OUT[left][0]} | ALSO_FAILS[left] if left else set()) | VECTORIZED
    assert failed == want, f"failed {sorted(failed)}, expected {sorted(want)}\n{run.stdout[-4000:]}"
    if left:
        assert LEFT_OUT[left][1] in run.stdout, run.stdout[-4000:]


#: Undoes DeepSpeed PR 8210 (issue 6659): the secondary (hpZ) shard of a param smaller than the secondary
#: partition is copied from past the param's end, which raises ``start out of range``.
UNDO_8210 = (
    "runtime/zero/partition_parameters.py",
    "                param.ds_secondary_tensor.zero_()\n"
    "                if sec_numel > 0:\n"
    "                    param.ds_secondary_tensor.narrow(0, 0, sec_numel).copy_(\n"
    "                        one_dim_param.narrow(0, secondary_start, sec_numel))",
    "                param.ds_secondary_tensor.narrow(0, 0, sec_numel).copy_(\n"
    "                    one_dim_param.narrow(0, secondary_start, sec_numel))",
)


@pytest.mark.proof
def test_hpz_small_param_crash_fails_the_edge_sizes(run_suite, tmp_path_factory):
    """Why: 008-f's params smaller than the world are what hpZ's secondary shards get wrong; with DeepSpeed's
    fix of that (PR 8210) undone on a copy of 0.19.8, 008-f's sizes test fails under the hpz profile,
    naming the raise, and passes without hpZ (its scalar test fails either way: DeepSpeed bug 15)."""
    from forks import ForkCache

    fork = ForkCache(tmp_path_factory, {"undo-8210": UNDO_8210})("undo-8210")
    run = run_suite(fork, "008-f", "--zero3-profile=fp32,hpz", "-k", "sizes")
    failed = _failed(run)
    assert failed == {"test_contract[008-f-sizes-hpz]"}, f"failed {sorted(failed)}\n{run.stdout[-4000:]}"
    assert "start out of range" in run.stdout, run.stdout[-4000:]


#: The poison axis's known-bad: each rank's reduce-scatter output keeps the padding of its last chunk
#: (``torch.empty``, never written), so the padded tail of a gradient partition holds whatever the
#: allocator left there, and the clipping norm sums it.
PADDING_READ = (
    "runtime/comm/coalesced_collectives.py",
    "            0, offset, partition_lst_for_each_tensor[tensor_idx][this_rank].numel())",
    "            0, offset, padded_partition_sz_for_each_tensor[tensor_idx])",
)


@pytest.mark.slow
def test_padding_read_fails_by_default(run_suite, tmp_path_factory):
    """Why (issue 39, uninitialised memory; issue 54, by default): a bug that reads padding shows only
    when the allocator hands back dirty memory.  Every gate run fills it with NaN unless
    ``--zero3-poison=off``: 005-d (uneven partitions, a small reduce bucket) fails on every run with no
    option given; with memory left unfilled, 005-d passed in every run measured (the other contracts
    that read the tail, 008-a and 008-f, caught it there by the allocator's luck)."""
    from forks import ForkCache

    fork = ForkCache(tmp_path_factory, {"padding-read": PADDING_READ})("padding-read")
    run = run_suite(fork, "005-d")  # no option: poisoned
    assert run.outcomes().get("005-d") == "fail", run.stdout[-4000:]


def test_stock_coalesce_fails_the_loop_forms(run_suite):
    """Why (the loop-form axis, the cheap half): stock 0.19.8 steps only every second coalesced block under
    accumulation 2 (DeepSpeed bug 16), and 008-g's coalesce form fails from the window after the first
    skipped step, while the form without the block (the boundary set by hand, the same windows) passes;
    retain_graph (issue 7352) fails beside it."""
    run = run_suite("installed", "008-g", "-k", "coalesce or set_boundary or retain_graph")
    failed = _failed(run)
    assert failed == {
        "test_contract[008-g-coalesce]",
        "test_contract[008-g-retain_graph]",
    }, f"failed {sorted(failed)}\n{run.stdout[-4000:]}"
    assert "coalesce window 1 (1 micro-batches), before its step: gradient" in run.stdout, run.stdout[-4000:]


#: The loop-form axis's known-bad: ``backward(scale_wrt_gas=False)`` divides by the accumulation anyway.
IGNORE_SCALE_WRT_GAS = (
    "runtime/engine.py",
    "            loss = loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss\n",
    "            loss = loss / self.gradient_accumulation_steps()\n",
)


def test_stock_predivide_fails_the_config_keys(run_suite):
    """Why (the config-key axis, every run): stock 0.19.8 divides every gradient by the world size once
    more when gradient_predivide_factor equals it without reduce-scatter (DeepSpeed bug 17): 008-h fails
    that variant alone, naming gradients half the twin's; its other keys pass or are refused at
    initialize as documented (the variants with a predivide factor run here)."""
    run = run_suite("installed", "008-h", "-k", "predivide")
    failed = _failed(run)
    assert failed == {"test_contract[008-h-gradient_predivide_factor-no_reduce_scatter]"}, (
        f"failed {sorted(failed)}\n{run.stdout[-4000:]}"
    )
    assert "(rel 0.5)" in run.stdout, run.stdout[-4000:]


#: The checkpoint-option axis's known-bad: stage 3's 16-bit export keeps frozen params whatever
#: ``exclude_frozen_parameters`` says (an adapter file then carries the whole frozen base).
KEEP_FROZEN_IN_16BIT = (
    "runtime/engine.py",
    "                            if param is None or (exclude_frozen_parameters and not param.requires_grad):\n",
    "                            if param is None:\n",
)


#: The scheduler's load option's known-bad: ``load_checkpoint`` restores the saved schedule whatever
#: ``load_lr_scheduler_states`` says (a fine-tune that asked for a fresh warm-up resumes the old one).
SCHEDULER_ALWAYS_LOADED = (
    "runtime/engine.py",
    "            if load_lr_scheduler_states and self.lr_scheduler is not None:\n",
    "            if self.lr_scheduler is not None:\n",
)


#: The user-optimizer axis's known-bad: ``zero_force_ds_cpu_optimizer`` never checked, so a torch optimizer
#: steps the offloaded partitions whatever the key says (the key's one promise broken in silence).
FORCE_CPU_OPTIMIZER_IGNORED = (
    "runtime/engine.py",
    "                if self.zero_force_ds_cpu_optimizer():\n",
    "                if False:\n",
)


#: The zero.Init/GatheredParameters axis's known-bad: ``GatheredParameters(enabled=False)`` gathers anyway.
GATHERED_ENABLED_IGNORED = (
    "runtime/zero/partition_parameters.py",
    "        self.enabled = enabled\n"
    "        self._param_versions = None\n"
    "        self._fallback_owners = {}\n"
    "        if not enabled:\n"
    "            return\n",
    "        self.enabled = True\n        self._param_versions = None\n        self._fallback_owners = {}\n",
)


#: The z3-leaf-helper axis's known-bad: ``set_z3_leaf_modules_by_name(..., flag=False)`` flags anyway.
BY_NAME_IGNORES_FLAG = (
    "utils/z3_leaf_module.py",
    "        module._z3_leaf = flag\n        leaf_modules.append(module)\n\n    if missing and raise_if_not_found:\n"
    "        raise ValueError(f'No modules named {missing}",
    "        module._z3_leaf = True\n        leaf_modules.append(module)\n\n    if missing and raise_if_not_found:\n"
    "        raise ValueError(f'No modules named {missing}",
)


#: The bf16-masters axis's known-bad: ``bf16_master_weights_and_grads`` read and then ignored, so the
#: optimizer keeps fp32 masters (twice the memory the key exists to save; the numbers stay right).
BF16_MASTERS_IGNORED = (
    "runtime/base_optimizer.py",
    "        elif self.bf16_master_weights_and_gradients:\n            return torch.bfloat16\n",
    "        elif self.bf16_master_weights_and_gradients:\n            return torch.float32\n",
)


#: The tensor-overrides axis's known-bad: ``zero.Init`` overrides the dtype of what its constructors make
#: whatever ``tensor_overrides`` lists (a RoPE table the user kept fp32 rounded to bf16).
OVERRIDES_IGNORED = (
    "runtime/zero/partition_parameters.py",
    "        if DeepSpeedTensorOverride.dtype in self.tensor_overrides:\n",
    "        if True:\n",
)


#: The init_linear axis's known-bad: ``TiledLinear.copy_params_from`` writes each tile inside a gather
#: without ``modifier_rank``, so ZeRO-3 drops the write when the tile is partitioned again.
INIT_LINEAR_DROPPED = (
    "runtime/zero/tiling.py",
    "                with deepspeed.zero.GatheredParameters(local.weight, modifier_rank=0):\n",
    "                with deepspeed.zero.GatheredParameters(local.weight):\n",
)


#: The compile_kwargs axis's known-bad: ``engine.compile`` drops its ``compile_kwargs`` (a fork's
#: refactor that passes the backend alone: the user's mode, dynamic and options silently lost).
COMPILE_KWARGS_DROPPED = (
    "runtime/engine.py",
    "            self.module.compile(**{**compile_kwargs, 'backend': backend})\n",
    "            self.module.compile(backend=backend)\n",
)


#: The compiled-autograd axis's known-bad: ``engine.compile`` drops ``compiled_autograd_enabled`` (the
#: engine compiles, the backward stays eager: the user's option silently lost).
COMPILED_AUTOGRAD_DROPPED = (
    "runtime/engine.py",
    "                self._is_compiled_autograd_enabled = compiled_autograd_enabled\n",
    "                self._is_compiled_autograd_enabled = False\n",
)


#: The promised-precision axis's known-bad (issue 54, item 5): ``data_types.grad_accum_dtype`` fp32 under bf16
#: accumulated in the weights' dtype (each micro-batch's sum rounded to bf16: 1e-3 relative, inside bf16's
#: parity tolerance, so 008-h passed it until the twin followed the path's dtypes, ``twin.PathGrads``).
ACCUM_NARROWED = (
    "runtime/zero/stage3.py",
    "            elif get_accelerator().on_accelerator(grad_buffer):\n"
    "                grad_buffer.add_(grad_partition.to(self.gradient_accumulation_dtype).view(grad_buffer.shape))\n",
    "            elif get_accelerator().on_accelerator(grad_buffer):\n"
    "                grad_buffer.copy_((grad_buffer + grad_partition.view(grad_buffer.shape)).to(self.dtype))\n",
)


#: A widened dtype narrowed on the way, which no contract judged before the twin's path compared the weights
#: after each step with the masters (issue 54, item 5): 0.19.8 writing the updated masters back to the
#: module's partitions through the communication dtype.  A no-op where the weights are in that dtype already
#: (bf16 training, fp32 training without a communication dtype); fp32 weights under a bf16 reduction are
#: rounded to bf16 after every step: 1e-3 relative, inside bf16's tolerance, which every comparison of those
#: runs with plain torch takes (the forward rounds like bf16 there).
WEIGHTS_NARROWED = (
    "runtime/zero/stage3.py",
    "            self.fp16_partitioned_groups_flat[sub_group_id].data.copy_(\n"
    "                self.fp32_partitioned_groups_flat[sub_group_id].data)\n",
    "            self.fp16_partitioned_groups_flat[sub_group_id].data.copy_(\n"
    "                self.fp32_partitioned_groups_flat[sub_group_id].data.to(self.communication_data_type))\n",
)


#: The cheap half of the newest axes' proofs: one fork with the six edits (each reaches only its own
#: variant), one run of those variants: test -> a phrase of its message.
NEW_AXES = [
    BF16_MASTERS_IGNORED,
    OVERRIDES_IGNORED,
    INIT_LINEAR_DROPPED,
    COMPILE_KWARGS_DROPPED,
    COMPILED_AUTOGRAD_DROPPED,
    ACCUM_NARROWED,
]
NEW_AXES_FAIL = {
    "test_contract[008-h-bf16.bf16_optimizer_states]": "masters torch.float32, moments torch.float32",
    "test_contract[008-j-tensor_overrides=[device]]": "buffers made in the context are",
    "test_contract[008-j-TiledLinear-init_linear]": "do not hold the Linear's values",
    "test_contract[008-g-compile_kwargs]": "still compiled:",
    "test_contract[008-m]": "(the option was dropped)",
    "test_contract[008-h-data_types.grad_accum_dtype=fp32]": "reduced in bf16, accumulated in fp32",
}


def test_each_new_axis_flags_its_fork(run_suite, tmp_path_factory):
    """Why (bf16 masters, tensor_overrides, init_linear, compile_kwargs, compiled autograd, the fp32 accumulation
    narrowed: the cheap half): each edit fails its variant, naming what it broke, and nothing else of the
    variants run.  The bf16-masters variant
    without the optimizer offload (a fork builds DeepSpeedCPUAdam anew: a minute); the whole suite per
    fork is the proof run's (:data:`WHOLE_SUITE_FORKS`)."""
    from forks import ForkCache

    fork = ForkCache(tmp_path_factory, {"new-axes": NEW_AXES})("new-axes")
    run = run_suite(
        fork,
        "008-g,008-h,008-j,008-m",
        "-k",
        "bf16_optimizer_states or tensor_overrides or Tiled or compile_kwargs or 008-m or grad_accum",
    )
    assert _failed(run) == set(NEW_AXES_FAIL), run.stdout[-4000:]
    for test, says in NEW_AXES_FAIL.items():
        assert says in run.stdout, f"{test}: {says!r} not in\n{run.stdout[-4000:]}"


#: One-line forks of 0.19.8, each the known-bad of an axis no other contract drives: over the whole suite
#: with 0.19.8's expectations its tests fail, with a line naming the bug.  name -> (the edit, its test or
#: tests, a phrase of the message).  Why no other contract sees each:
WHOLE_SUITE_FORKS = {
    # every other contract calls engine.backward(loss) with its defaults
    "ignore-scale-wrt-gas": (
        IGNORE_SCALE_WRT_GAS,
        "test_contract[008-g-scale_wrt_gas]",
        "scale_wrt_gas window 0 (2 micro-batches), before its step: gradient of",
    ),
    # no other contract saves a 16-bit model without its frozen params
    "keep-frozen": (
        KEEP_FROZEN_IN_16BIT,
        # and the seq family's first anchor, which exports with exclude_frozen_parameters too
        ("test_contract[008-i-16bit]", "test_seq"),
        "has norm.weight, which it should leave out",
    ),
    # family 004 resumes with the saved schedule (the default)
    "scheduler-loaded": (
        SCHEDULER_ALWAYS_LOADED,
        "test_contract[008-i-load_lr_scheduler_states=False]",
        "the learning rates are",
    ),
    # no other contract hands a torch optimizer to an engine that offloads the optimizer, the key at its default
    "force-cpu-ignored": (
        FORCE_CPU_OPTIMIZER_IGNORED,
        "test_contract[008-l-offload-forced]",
        "zero_force_ds_cpu_optimizer true",
    ),
    # no other contract opens GatheredParameters(enabled=False) (HF's code does: enabled=is_deepspeed_zero3_enabled())
    "gathered-enabled": (
        GATHERED_ENABLED_IGNORED,
        "test_contract[008-j-gathered-enabled=False]",
        "GatheredParameters(enabled=False) gathered params inside it",
    ),
    # no other contract sets a bf16 master key (the numbers stay within bf16's tolerance without it)
    "bf16-masters": (
        BF16_MASTERS_IGNORED,
        (
            "test_contract[008-h-bf16.bf16_master_weights_and_grads]",
            "test_contract[008-h-bf16.bf16_optimizer_states]",
        ),
        "masters torch.float32, moments torch.float32",
    ),
    # no other contract gives zero.Init tensor_overrides (the default overrides the dtype anyway)
    "overrides-ignored": (
        OVERRIDES_IGNORED,
        "test_contract[008-j-tensor_overrides=[device]]",
        "zero.Init(tensor_overrides=[device]): buffers made in the context are",
    ),
    # no other contract tiles a Linear from another (008-j's other tiled variants start from their own init)
    "init-linear-dropped": (
        INIT_LINEAR_DROPPED,
        "test_contract[008-j-TiledLinear-init_linear]",
        "do not hold the Linear's values",
    ),
    # the compile profile compiles with the backend alone
    "compile-kwargs-dropped": (
        COMPILE_KWARGS_DROPPED,
        "test_contract[008-g-compile_kwargs]",
        "still compiled:",
    ),
    # no other contract asks for compiled autograd
    "compiled-autograd-dropped": (
        COMPILED_AUTOGRAD_DROPPED,
        "test_contract[008-m]",
        "(the option was dropped)",
    ),
    # no other contract sets data_types.grad_accum_dtype (the rounding stays inside bf16's parity tolerance)
    "accum-narrowed": (
        ACCUM_NARROWED,
        "test_contract[008-h-data_types.grad_accum_dtype=fp32]",
        "reduced in bf16, accumulated in fp32",
    ),
    # only fp32 weights under a bf16 reduction meet it: 008-h's bf16 communication of fp32 training, and
    # 008-j's models that zero.Init's tensor_overrides keep in fp32 under a bf16 config
    "weights-narrowed": (
        WEIGHTS_NARROWED,
        (
            "test_contract[008-h-communication_data_type=bf16]",
            "test_contract[008-j-tensor_overrides=[]]",
            "test_contract[008-j-tensor_overrides=[device]]",
        ),
        "against its masters in float32",
    ),
    # no other contract unflags a leaf by name (a leaf changes when params are gathered, never the numbers)
    "by-name-flag": (
        BY_NAME_IGNORES_FLAG,
        "test_contract[008-k-by_name]",
        "by_name: get_z3_leaf_modules gives",
    ),
}


@pytest.mark.proof
@pytest.mark.parametrize("name", WHOLE_SUITE_FORKS)
def test_one_line_fork_fails_only_its_own_test(run_pytest, tmp_path_factory, name):
    """Why: a contract is proven only by an implementation that breaks it and that every other contract
    lets through; each fork of :data:`WHOLE_SUITE_FORKS` fails exactly its test over the whole suite."""
    from forks import ForkCache

    edit, tests, says = WHOLE_SUITE_FORKS[name]
    fork = ForkCache(tmp_path_factory, {name: edit})(name)
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    run = run_pytest(str(ROOT / "conformance"), f"--zero3-impl={fork}", f"--zero3-expect={expect}")
    failed = _failed(run)
    assert failed == ({tests} if isinstance(tests, str) else set(tests)), (
        f"failed {sorted(failed)}\n{run.stdout[-4000:]}"
    )
    assert says in run.stdout, run.stdout[-4000:]
