"""Simulated DeepSpeed forks: a copy of the installed deepspeed package, optionally with one file changed."""

import os
import shutil


def copy_installed_deepspeed(dest):
    """Copy the installed ``deepspeed`` package to ``dest/deepspeed``; return ``dest``."""
    import importlib.util

    src = os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    # With its byte code: copytree keeps the mtimes, so every file not edited afterwards imports without
    # compiling (a second or so per process that imports the fork).
    shutil.copytree(src, os.path.join(dest, "deepspeed"))
    return dest


#: Fixes 001-a on 0.19.8 (two leaks, the bug of DeepSpeed PR 8883): destroy() drops the root module it
#: pushed on FWD_MODULE_STACK, and the release sets are no longer lru_cache'd (class-level, keyed by the
#: coordinator and its modules).
FIX_001A = [
    (
        "runtime/zero/parameter_offload.py",
        "    def destroy(self):\n        self._remove_module_hooks()\n",
        "    def destroy(self):\n        self._remove_module_hooks()\n"
        "        FWD_MODULE_STACK[:] = [m for m in FWD_MODULE_STACK if m is not self.module]\n",
    ),
    (
        "runtime/zero/partitioned_param_coordinator.py",
        "    @functools.lru_cache(maxsize=None)\n    def __params_to_release(",
        "    def __params_to_release(",
    ),
]
#: Breaks 002-a (undoes the 0.19.3 checkpoint fix): the coordinator no longer recognises forward hooks that
#: run inside a backward recompute, so frozen params are partitioned while checkpoint holds them.
BREAK_002A = (
    "runtime/zero/partitioned_param_coordinator.py",
    "in_checkpoint_recompute = forward and torch._C._current_graph_task_id() != -1",
    "in_checkpoint_recompute = False",
)


#: Breaks 008-b on 0.19.8 behind its known failure (bug 10, listed): safe_set_local_grad under
#: offload_optimizer no longer recomputes the param's gradient norm (an upstream fix undone), so the step
#: clips by, and get_global_grad_norm() reports, the norm of the gradients before the write.
BREAK_LOCAL_GRAD_NORM = (
    "runtime/zero/stage3.py",
    "        if self.offload_optimizer:\n"
    "            self.norm_for_param_grads[self.get_param_id(param)] = self._constant_buffered_norm2(value)\n\n"
    "        fp32_grad, group_idx = self._get_fp32_grad_state_partition(param=param, release_swap_buffers=False)\n"
    "        fp32_grad.data.copy_(value.flatten().data)",
    "        fp32_grad, group_idx = self._get_fp32_grad_state_partition(param=param, release_swap_buffers=False)\n"
    "        fp32_grad.data.copy_(value.flatten().data)",
)


#: Breaks 008-e on 0.19.8 behind its known failure (bug 13, the copy's empty placeholders, listed): every
#: hooked module carries a record whose deepcopy raises from inside DeepSpeed (a TypeError that names no
#: copy), so copy.deepcopy(engine.module) crashes instead of refusing or copying.  Judged as a refusal at
#: the call, 008-e read it as right.
BREAK_DEEPCOPY_CRASH = [
    (
        "runtime/zero/parameter_offload.py",
        "        module.ds_id = my_count\n",
        "        module.ds_id = my_count\n        module.ds_layout = _Layout()\n",
    ),
    (
        "runtime/zero/parameter_offload.py",
        "FWD_MODULE_STACK = list()",
        "FWD_MODULE_STACK = list()\n\n\nclass _Layout:\n    def __deepcopy__(self, memo):\n        return (1,) + [1]\n",
    ),
]


#: Fixes DeepSpeed bug 11 (docs/results/bugs.md) on 0.19.8: destroy() drops each module's backward functions,
#: which close over the destroyed offload, so a model wrapped again runs its backward into its own engine.
#: The forks of families 005 and 006 start from it, so that 005-c and 006-c judge their own edit.
FIX_REWRAP = (
    "runtime/zero/parameter_offload.py",
    "    def destroy(self):\n        self._remove_module_hooks()\n",
    "    def destroy(self):\n        self._remove_module_hooks()\n"
    "        for module in self.module.modules():\n"
    '            module.__dict__.pop("pre_bwd_fn", None)\n'
    '            module.__dict__.pop("post_bwd_fn", None)\n',
)


def edit(fork_dir, relpath, old, new):
    """Replace ``old`` (which must occur) with ``new`` in one file of the fork."""
    path = os.path.join(fork_dir, "deepspeed", relpath)
    text = open(path).read()
    assert old in text, f"{relpath} no longer contains {old!r}: update this simulated fork"
    with open(path, "w") as fh:
        fh.write(text.replace(old, new))


class ForkCache:
    """``forks(name)``: a copy of the installed deepspeed with ``edits[name] = (relpath, old, new)``
    (or a list of such edits) applied, built once per cache (a module-scoped fixture holds one)."""

    def __init__(self, tmp_path_factory, edits):
        self._factory, self._edits, self._built = tmp_path_factory, edits, {}

    def __call__(self, name):
        if name not in self._built:
            edits = self._edits[name]
            fork = copy_installed_deepspeed(str(self._factory.mktemp(f"fork-{name}")))
            for relpath, old, new in edits if isinstance(edits, list) else [edits]:
                edit(fork, relpath, old, new)
            self._built[name] = fork
        return self._built[name]


def bite_groups(bugs: dict) -> list:
    """Bugs that can share one fork in the cheap "each contract bites" runs: ``bugs`` maps a bug's name
    to ``(must_fail, may_fail)`` contract sets, and a group never holds two bugs where one's contract
    may fail because of the other's (by the lists the proof run checks per bug, one fork each), so
    each contract of a group's fork fails for its own bug.  Greedy, in ``bugs``' order."""
    groups: list = []
    for name, (must, may) in bugs.items():
        for group in groups:
            if all(not (must & (bugs[o][0] | bugs[o][1])) and not (bugs[o][0] & may) for o in group):
                group.append(name)
                break
        else:
            groups.append([name])
    return [tuple(g) for g in groups]


def unbitten(run, bugs: dict, group) -> dict:
    """The cheap bite runs' check: ``{label: outcome}`` for each bug of ``group`` whose contract did not
    fail on the group's fork (``bugs`` maps a bug's name to a tuple of its contract first, its label last)."""
    outcomes = run.outcomes()
    return {bugs[name][-1]: outcomes.get(bugs[name][0]) for name in group if outcomes.get(bugs[name][0]) != "fail"}


#: Breaks rule-b on 0.19.8 behind its known failures (the retention, the returned param, the stale release
#: cache, each an executable relaxation of the rules): a module's post-backward hook no longer releases its
#: params, which wait for the end-of-backward clean-up (a fork that defers backward releases).
BREAK_BACKWARD_RELEASE = (
    "runtime/zero/partitioned_param_coordinator.py",
    "if param.ds_id in params_to_release and not param.is_external_param:",
    "if param.ds_id in params_to_release and not param.is_external_param and forward:",
)


#: Known-bads of issue 53 (item 7): 0.19.8 with a second, different bug that a listed test reaches, each
#: failing that test behind its known failure (tests/test_fork_gate.py, docs/results/proofs.md's table).

#: Behind 001-b and rule-c (the stale release cache, PR 8883): the reuse scan starts one trace position
#: late (an off-by-one on the step id, which already points past the released module), so a param whose
#: next use is the very next fetch is released and gathered again although the window keeps it.
BREAK_REUSE_SCAN_START = (
    "runtime/zero/partitioned_param_coordinator.py",
    "        for module in self.__submodule_order[step_id:]:\n",
    "        for module in self.__submodule_order[step_id + 1:]:\n",
)

#: Behind 000-a (prefetch-skip retention, listed): the ZeRO-3 optimizer no longer passes
#: stage3_prefetch_bucket_size on to the param offload (a keyword dropped), which prefetches by its
#: default 5e7 bucket, so with a bucket under one layer prefetch skips, and the retention keeps, every
#: already-run layer as with an unbounded one.
BREAK_PREFETCH_BUCKET_DROPPED = (
    "runtime/zero/stage3.py",
    "                                    prefetch_bucket_size=prefetch_bucket_size,\n",
    "",
)

#: Behind 000-d (prefetch-skip retention, listed for its small-bucket variant): 000-e's scan fixed the
#: wrong way, every scanned module counted with its whole subtree (recurse=True, not its own leaf flag),
#: so a container in the window (the root's backward after the last layer) keeps params the rule
#: releases, with prefetch off too.  000-e's own models read the same as stock's bug there.
BREAK_REUSE_SCAN_RECURSE = (
    "runtime/zero/partitioned_param_coordinator.py",
    "            for param in iter_params(module, recurse=z3_leaf_module(submodule_to_release)):\n",
    "            for param in iter_params(module, recurse=True):\n",
)

#: Behind 000-e (its scan reads every scanned module by the released module's z3-leaf flag, listed): the scan
#: fixed the other wrong way, every scanned module counted by its own params only (recurse=False), so a z3
#: leaf's next use (its backward, where its children's params are gathered) counts nothing and the leaf's
#: params are released after its forward although the window keeps them.
BREAK_REUSE_SCAN_OWN = (
    "runtime/zero/partitioned_param_coordinator.py",
    "            for param in iter_params(module, recurse=z3_leaf_module(submodule_to_release)):\n",
    "            for param in iter_params(module, recurse=False):\n",
)

#: Behind base-e (bug 12: persistent params released while the first trace is recorded): the release
#: set no longer leaves out persistent params, so every forward on a complete trace releases them too.
BREAK_PERSISTENT_RELEASE = (
    "runtime/zero/partitioned_param_coordinator.py",
    "            p.ds_id for p in iter_params(submodule_to_release, recurse=z3_leaf_module(submodule_to_release))\n"
    "            if not p.ds_persist)",
    "            p.ds_id for p in iter_params(submodule_to_release, recurse=z3_leaf_module(submodule_to_release)))",
)

#: Behind rule-d (the live count reset_step zeroes, a relaxation of the rule model): prefetch's budget
#: is the bucket alone, stage3_max_live_parameters no longer caps it, so prefetch exceeds the limit even
#: by the relaxed count.
BREAK_PREFETCH_LIVE_CAP = (
    "runtime/zero/partitioned_param_coordinator.py",
    "                max_params_to_prefetch = min(self.__max_n_available_params - self.__n_available_params,\n"
    "                                             self.__prefetch_bucket_sz)",
    "                max_params_to_prefetch = self.__prefetch_bucket_sz",
)

#: Behind rule-a (the recompute releasing claimed params, the bug of 002-g, and base-j's leaf crash):
#: the fetch ignores the z3 leaf flag (its own params only), so a leaf's children are not gathered at the
#: start of the leaf's forward.
BREAK_LEAF_FETCH = (
    "runtime/zero/partitioned_param_coordinator.py",
    "        params_to_fetch = set(iter_params(current_submodule, recurse=is_leaf))\n",
    "        params_to_fetch = set(iter_params(current_submodule, recurse=False))\n",
)

#: Behind 008-a's offload variant (bug 9: reads between micro-batches return the last boundary's host
#: gradients): with the optimizer offloaded the global norm is no longer all-reduced over the partition
#: group, so each rank reports, and clips by, the norm of its own partition.
BREAK_OFFLOAD_NORM_ALLREDUCE = (
    "runtime/zero/stage3.py",
    "        total_norm_cuda = get_accelerator().FloatTensor([float(total_norm)])\n\n"
    "        dist.all_reduce(total_norm_cuda, op=dist.ReduceOp.SUM, group=process_group)\n",
    "        total_norm_cuda = get_accelerator().FloatTensor([float(total_norm)])\n\n",
)

#: Behind 006-c (bug 11: the modules' backward functions outlive destroy(), listed): unwrap_model_for_generation
#: removes the module hooks for generation but keeps the backward ones (a fork that re-registers only what
#: generate() needs gone), so each re-registration adds a second set of backward hooks to every module.
BREAK_GENERATION_BACKWARD_HOOKS = (
    "runtime/zero/stage3.py",
    "        for hook in optimizer_offload.backward_hooks:\n            hook.remove()\n\n",
    "",
)

#: Behind 004-e (the universal load leaves the frozen mid.weight at its fresh value, listed): the ZeRO-3
#: universal load restores the fp32 masters and the moments but no longer the saved param groups'
#: hyperparameters, so the first step after the load runs at the fresh engine's learning rate.  Hidden
#: while the entry explained the continuation's losses as the frozen weight's fallout; 004-e now writes
#: that weight back before it continues.
BREAK_UNIVERSAL_HYPERPARAMS = (
    "runtime/zero/stage3.py",
    "        for param_group in self.optimizer.param_groups:\n"
    "            # Generally, the hyperparameters of each parameter should be the same, we can obtain from any parameter.\n"
    '            for key, value in optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][0].items():\n'
    "                if key == 'params':\n"
    "                    param_group['params'] = []\n"
    "                else:\n"
    "                    param_group[key] = value\n",
    "",
)

#: Behind 004-g (the save's prologue partitions the param an open GatheredParameters holds, listed): the
#: checkpoint's tied-weight map keys params by data_ptr() under ZeRO-3 too (the ds_id key undone), and the
#: partitioned params' empty placeholders share one address, so zero_to_fp32 writes one param's weights
#: under the other params' names.
BREAK_SHARED_BY_DATA_PTR = (
    "runtime/engine.py",
    "                param_id = param.ds_id if is_zero3_model else param.data_ptr()\n",
    "                param_id = param.data_ptr()\n",
)

#: Behind base-i (a no-grad forward leaves the prefetches aimed at backward in flight, listed for the
#: two-layer window): GatheredParameters' exit no longer lowers the param's gathered-context depth (a fork
#: that took the refusal of overlapping contexts without its bookkeeping), so the next gather of a param
#: once gathered is refused as nested: the user's second GatheredParameters raises.
BREAK_GATHERED_DEPTH = (
    "runtime/zero/partition_parameters.py",
    "            for param in self.params:\n"
    "                depth = getattr(param, DS_Z3_GATHERED_PARAM_CONTEXT_DEPTH_ATTR, 0)\n"
    "                if depth <= 1:\n"
    "                    if hasattr(param, DS_Z3_GATHERED_PARAM_CONTEXT_DEPTH_ATTR):\n"
    "                        delattr(param, DS_Z3_GATHERED_PARAM_CONTEXT_DEPTH_ATTR)\n"
    "                else:\n"
    "                    setattr(param, DS_Z3_GATHERED_PARAM_CONTEXT_DEPTH_ATTR, depth - 1)\n",
    "",
)

#: Behind 007-b under hpZ (DeepSpeed issue 4901: the reference copy's second from_pretrained raises, listed;
#: the scenario goes on with a reference copy loaded whole): a param written in GatheredParameters
#: (modifier_rank=0: how from_pretrained loads each module's weights) keeps the hpZ secondary shard it had
#: before the write, so the policy's first forward gathers its zero.Init weights from there.
BREAK_HPZ_SECONDARY_UPDATE = (
    "runtime/zero/partition_parameters.py",
    "            if param.ds_secondary_tensor is not None and not has_been_updated:  ##param already partitioned\n",
    "            if param.ds_secondary_tensor is not None:  ##param already partitioned\n",
)

#: Behind 007-e under hpZ (DeepSpeed bug 8: load_checkpoint leaves a frozen param's hpZ secondary shard stale,
#: listed): checkpoint_event_epilogue no longer drops the trainable params' secondary shards either (the
#: invalidation undone), so the resumed engine's first forward gathers every param's pre-load weights.
BREAK_HPZ_LOAD_INVALIDATE = (
    "runtime/zero/stage3.py",
    "    def checkpoint_event_epilogue(self):\n        self.invalidate_secondary_tensor()\n",
    "    def checkpoint_event_epilogue(self):\n",
)

#: Behind 007-d (DeepSpeed converts nothing after initialize: the first forward after a replaced param
#: crashes on a missing ds_* attribute, listed): GatheredParameters takes any iterable for a list of params,
#: a single tensor too (the Tensor exclusion dropped), so a single partitioned param is iterated as its empty
#: data, nothing is gathered, and transformers' resize_token_embeddings reads the old embedding's size
#: from the placeholder: the change itself raises, a new failure, not the listed one.
BREAK_GATHER_SINGLE_PARAM = (
    "runtime/zero/partition_parameters.py",
    "        if isinstance(params, Iterable) and not isinstance(params, torch.Tensor):\n",
    "        if isinstance(params, Iterable):\n",
)

#: Behind 008-d's module-only variant (load_optimizer_states=True with load_module_only=True loads the
#: module state dict of ZeRO-3 placeholders, listed for that pair): a module-only load no longer takes the
#: weights from the ZeRO shards (zero_to_fp32) but from the model-states file alone, so with
#: load_optimizer_states=False too the engine keeps its fresh weights.
BREAK_MODULE_ONLY_SHARDS = (
    "runtime/engine.py",
    "        if self.zero_optimization_partition_weights() and not load_optimizer_states and not self.has_moe_layers:\n",
    "        if (self.zero_optimization_partition_weights() and not load_optimizer_states and not load_module_only\n"
    "                and not self.has_moe_layers):\n",
)

#: Behind 008-i's use_node_local_storage variant (DeepSpeed bug 20: 'latest' written on global rank 0
#: only, so node 1 resumed without a tag loads nothing, listed; its fallout once explained every check after
#: the load, and the scenario now resumes every node from its tag): the ZeRO shards' optimizer states are
#: no longer loaded (the option dropped in the call), so the resumed engine's Adam starts from zero moments.
BREAK_ZERO_LOAD_OPTIMIZER = (
    "runtime/engine.py",
    "                                       load_optimizer_states=load_optimizer_states,\n"
    "                                       load_from_fp32_weights=self.zero_load_from_fp32_weights(),\n",
    "                                       load_optimizer_states=False,\n"
    "                                       load_from_fp32_weights=self.zero_load_from_fp32_weights(),\n",
)

#: Behind 008-g's coalesce variant (DeepSpeed bug 16: the step after a coalesce_grad_reduction block steps
#: only every k-th block, listed with its numeric fallout): the block's exit no longer clears the no_sync flag
#: it set, so the next block asserts that it is nested inside another no_sync context.
BREAK_COALESCE_NO_SYNC_RESET = (
    "runtime/engine.py",
    "            optimizer._coalesce_grad_reduction = False\n            self.inside_no_sync_ctxt = False\n",
    "            optimizer._coalesce_grad_reduction = False\n",
)

#: Behind base-j (a z3 leaf whose input has no grad crashes step 0's backward, listed): the granularity
#: threshold's container exclusion narrowed to the containers that never run a forward (ModuleList,
#: ModuleDict), so a Sequential is a leaf candidate too, and the threshold flags the model's root (its
#: granularity 816 // 5 = 163) in place of the experts.  The root's backward crashes as the experts' did;
#: the leaf it picked is the new problem.
BREAK_THRESHOLD_CONTAINER = (
    "runtime/zero/parameter_offload.py",
    "        if module.__class__.__name__ in torch.nn.modules.container.__all__:\n",
    "        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):\n",
)


#: Behind 008-h's predivide variant without reduce-scatter (DeepSpeed bug 17: every gradient halved, listed
#: by that ratio): the global gradient norm is no longer all-reduced over the partition group, so each rank
#: clips its partition by the norm of its own.  The halved gradients already differ from the twin's at
#: every micro-step; the step from them is judged apart (the weights after it, a problem bug 17 has not).
BREAK_GRAD_NORM_ALLREDUCE = (
    "runtime/zero/stage3.py",
    "                total_norm_cuda = torch.sum(torch.pow(torch.stack(grad_norms), norm_type))\n\n"
    "            dist.all_reduce(total_norm_cuda, op=dist.ReduceOp.SUM, group=process_group)\n",
    "                total_norm_cuda = torch.sum(torch.pow(torch.stack(grad_norms), norm_type))\n\n",
)


#: Behind 008-f's scalar variant (DeepSpeed bug 15: a 0-dim param refused by the byte-view broadcast in
#: deepspeed.initialize, listed): the param conversion counts a param's elements as the product of its dims
#: (functools.reduce without the initial 1), which for a 0-dim param raises a TypeError in the conversion,
#: before the broadcast: the engine build fails with an error the entry does not name.
BREAK_NUMEL_BY_DIMS = (
    "runtime/zero/partition_parameters.py",
    "        param.ds_numel = param.numel()\n",
    "        param.ds_numel = functools.reduce(lambda a, b: a * b, param.shape)\n",
)


#: Behind 002-g's frozen-norms variant (with checkpoint early-stop off the recompute partitions the params
#: of the Linear whose backward is running: step 0's first backward raises, listed): zero.Init(module=...),
#: which converts a model built outside zero.Init when the engine is made, converts only the trainable
#: params (frozen ones taken to be replicated, a shortcut for adapters), so the frozen norms stay plain
#: params and the engine build, marking persistent params, meets one with no ZeRO state: an AttributeError
#: in deepspeed.initialize, before the backward whose crash the entry names.
BREAK_INIT_MODULE_TRAINABLE_ONLY = (
    "runtime/zero/partition_parameters.py",
    "            self._convert_to_zero_parameters(module.parameters(recurse=True))\n",
    "            self._convert_to_zero_parameters(p for p in module.parameters(recurse=True) if p.requires_grad)\n",
)


#: Behind 008-j's zero_param_parallel_group variant (DeepSpeed bug 19: zero.Init sizes hpZ's secondary
#: partitions by DeepSpeed's own hpZ group, none before the first engine, and the first forward's gather over
#: the given group raises, listed): zero.Init sizes them by the group it is given (half of bug 19's fix) but
#: still takes each rank's place in the group from DeepSpeed's own (the global rank), so on the ranks of
#: the second group the first forward's gather indexes its group's partitions by the global rank and
#: raises an IndexError: the sizes are right, the gather's error is another than the one the entry names.
BREAK_HPZ_GROUP_RANK = (
    "runtime/zero/partition_parameters.py",
    "            self.num_ranks_in_param_group = groups._get_zero_param_intra_parallel_group_world_size()\n",
    "            self.num_ranks_in_param_group = dist.get_world_size(group=self.zero_param_process_group)\n",
)


#: Behind 008-m under the compile profile (compiled autograd hands stage 3's post-accumulate-grad hook to
#: dynamo, which raises in the first backward, listed): engine.compile asks dynamo for one graph of the
#: forward wherever compiled autograd is on (fullgraph=True, so that the captured backward has one forward
#: to match), which stage 3's hooks, kept out of the graph on purpose (compiler.disable), refuse: the
#: first forward raises dynamo's Unsupported at the root's pre-hook (reset_step), before the backward whose
#: crash the entry names.
BREAK_COMPILE_FULLGRAPH = (
    "runtime/engine.py",
    "            self.module.compile(**{**compile_kwargs, 'backend': backend})\n",
    "            self.module.compile(**{**compile_kwargs, 'backend': backend, 'fullgraph': compiled_autograd_enabled})\n",
)


#: Known-bads of issue 54 (item 6): 0.19.8 with one edit that only a pair of features reaches, each
#: flagged by the seq family's anchors (fixtures/seq/space.py ANCHORS) and by no hand-written contract.

#: A frozen embedding tied to a trainable head, saved and converted with exclude_frozen_parameters:
#: zero_to_fp32 recovers the tied name without checking that its source was saved (a KeyError).
BREAK_TIED_RECOVERY = (
    "utils/zero_to_fp32.py",
    "    for pair in zero_model_states[0].shared_params:\n"
    "        if pair[1] in state_dict:\n"
    "            state_dict[pair[0]] = state_dict[pair[1]]\n\n"
    "    return state_dict\n\n\n"
    "def to_torch_tensor(",
    "    for pair in zero_model_states[0].shared_params:\n"
    "        state_dict[pair[0]] = state_dict[pair[1]]\n\n"
    "    return state_dict\n\n\n"
    "def to_torch_tensor(",
)

#: A gradient that exactly fills the reduce bucket, with contiguous gradients and reduce_scatter off: the
#: copy into the contiguous buffer tests ``<`` for ``<=``, so the last gradient is not copied and the
#: all-reduce of the buffer reads the slot nobody wrote (poisoned: NaN).  With reduce_scatter on the
#: gradients are reduced from the params, and the exact fit reads right.
BREAK_IPG_EXACT_FIT = (
    "runtime/zero/stage3.py",
    "        if self.contiguous_gradients and bucket.elements + param.grad.numel() <= self.reduce_bucket_size:\n",
    "        if self.contiguous_gradients and bucket.elements + param.grad.numel() < self.reduce_bucket_size:\n",
)


#: Params fetched by all-reduce (stage3_use_all_reduce_for_fetch_params) with sizes that do not divide by
#: the world: the flat buffer's slots advance by each param's numel, not its aligned (padded) numel, so a
#: rank's partition of one param, padding included, is summed into the start of the next.  Even sizes,
#: or the default all-gather fetch, read right.
BREAK_ALLREDUCE_FETCH_UNALIGNED = (
    "runtime/zero/partition_parameters.py",
    "                    start_param += param.ds_numel_aligned\n",
    "                    start_param += param.ds_numel\n",
)


#: A module holding params of two dtypes (a frozen bf16 base beside fp32 adapters, loralib-style) fetched
#: by the all-gather path: the coalesced fetch takes its one communication dtype from the first param
#: instead of grouping the params by theirs, and the bucket's check asserts.  One dtype per fetch (every
#: model but such a module, or a prefetch across modules of two dtypes) reads right.
BREAK_FETCH_FIRST_DTYPE = (
    "runtime/zero/partition_parameters.py",
    "                        allgather_dtype = get_allgather_dtype(p, p.ds_tensor)\n",
    "                        allgather_dtype = get_allgather_dtype(params[0], params[0].ds_tensor)\n",
)


#: The model-states file of a checkpoint named by the node-local rank instead of the data-parallel rank: on
#: two nodes of one rank both write rank 0's file, and zero_to_fp32, which takes the frozen params'
#: fragments from every rank's file, finds one where the world has two.  On one node the local rank is
#: the global one, and the engine reloads its own file either way.
BREAK_CKPT_NAME_LOCAL_RANK = (
    "runtime/engine.py",
    "            if pp_placeholder is not None:\n"
    "                pp_rank = pp_placeholder\n"
    "            else:\n"
    "                pp_rank = dist.get_rank(group=self.optimizer.dp_process_group)\n",
    "            if pp_placeholder is not None:\n"
    "                pp_rank = pp_placeholder\n"
    "            else:\n"
    "                pp_rank = dist.get_local_rank()\n",
)

#: Behind seq-a's bug 23 (offload_states raises on a model with a frozen param, listed): the crash "fixed" by
#: a bounds check instead of the mapping, so a param whose slot would run past the buffer is skipped and
#: the frozen params before it are pointed at the optimizer's partitions of other params, where
#: reload_states (it re-points the optimizer's params only) leaves them: the frozen weights read others'.
#: Without a frozen param the mapping never runs past the buffer (contract 008-c trains every param).
BREAK_OFFLOAD_BOUNDS_GUARD = (
    "runtime/zero/stage3.py",
    "                [p.ds_tensor for p in self.module.parameters()]):\n"
    "                tensor.data = cpu_buffer.narrow(0, offset, tensor_numel)\n",
    "                [p.ds_tensor for p in self.module.parameters()]):\n"
    "                if offset + tensor_numel <= cpu_buffer.numel():\n"
    "                    tensor.data = cpu_buffer.narrow(0, offset, tensor_numel)\n",
)

#: GatheredParameters' exit with a modifier_rank broadcasts the write but partitions only the params that
#: are not persistent ("the coordinator keeps them gathered anyway"): a persistent param keeps the written
#: value in its gathered data and the old one in its partition, and the next fetch after a release reads
#: the old one.  The 16-bit export takes the same exit without writing; contract 005-b writes params that
#: are not persistent (threshold 0), as does every other contract that writes under a modifier_rank.
BREAK_MODIFIER_PERSISTENT = (
    "runtime/zero/partition_parameters.py",
    "        params_to_partition = self._params_to_partition()\n"
    "        self._record_deferred_updates(params_to_partition)\n"
    "        self._partition_params(params_to_partition, has_been_updated=True)",
    "        params_to_partition = [p for p in self._params_to_partition() if not p.ds_persist]\n"
    "        self._record_deferred_updates(params_to_partition)\n"
    "        self._partition_params(params_to_partition, has_been_updated=True)",
)

#: engine.module_state_dict(exclude_frozen_parameters=True) keeps only the names of trainable params, as
#: named_parameters() lists them (one name per param): a trainable weight tied to another module loses its
#: second name, and buffers are dropped.  save_checkpoint's module file then lacks them, which a load that
#: is not strict (as with frozen params left out) lets through.
BREAK_MODULE_STATE_TRAINABLE_ONLY = (
    "runtime/engine.py",
    "        if exclude_frozen_parameters:\n"
    "            for n, p in self.module.named_parameters():\n"
    "                if not p.requires_grad and n in sd:\n"
    "                    del sd[n]\n",
    "        if exclude_frozen_parameters:\n"
    "            trainable = {n for n, p in self.module.named_parameters() if p.requires_grad}\n"
    "            for n in [n for n in sd if n not in trainable]:\n"
    "                del sd[n]\n",
)


#: The optimizer step no longer re-gathers the persistent params (``_post_step``: "the next fetch gathers
#: them anyway").  On 0.19.8 that re-gather is what hides bug 12 at one micro-batch per step: the persistent
#: params released while the first trace is recorded stay partitioned after step 0.  base-e's entry
#: explained "after step 0" in any config while it listed the accumulation window's case by the same text.
BREAK_POST_STEP_REGATHER = (
    "runtime/zero/stage3.py",
    "        #Gathering persisting parameters\n"
    "        if len(self.persistent_parameters) > 0:\n"
    "            self.persistent_parameters[0].all_gather(self.persistent_parameters)\n",
    "",
)


#: The all-reduce fetch's flat buffer taken uninitialised (``torch.empty`` for ``torch.zeros``: "every slot
#: is written anyway"), where each rank writes only its own partition and the all-reduce sums the rest:
#: whatever memory held is summed into every fetched param.  Reached only where a config turns the
#: all-reduce fetch on: under draw 1 (torch_autocast with it), behind 0.19.8's entries for bug 25 in
#: base-d and 007-e, whose gradients already differ from the twin's by a bf16 ulp.  Poisoned memory makes
#: it NaN every run.
BREAK_ALLREDUCE_FETCH_UNINITIALISED = (
    "runtime/zero/partition_parameters.py",
    "                flat_tensor = torch.zeros(flat_buffer_size,\n"
    "                                          dtype=get_only_unique_item(p.ds_tensor.dtype for p in params),",
    "                flat_tensor = torch.empty(flat_buffer_size,\n"
    "                                          dtype=get_only_unique_item(p.ds_tensor.dtype for p in params),",
)


#: name -> (edit, the listed contracts it fails behind their known failures (measured), what else the run
#: needs: the selection is those contracts; the offloaded one builds DeepSpeedCPUAdam for the fork's
#: path in its forkserver, minutes on a loaded machine).
KNOWN_BADS = {
    "reuse_scan_start": (BREAK_REUSE_SCAN_START, ("001-b", "rule-c"), ()),
    "reuse_scan_recurse": (BREAK_REUSE_SCAN_RECURSE, ("000-d",), ()),
    "prefetch_bucket_dropped": (BREAK_PREFETCH_BUCKET_DROPPED, ("000-a",), ()),
    "persistent_release": (BREAK_PERSISTENT_RELEASE, ("base-e",), ()),
    "prefetch_live_cap": (BREAK_PREFETCH_LIVE_CAP, ("rule-d",), ()),
    "leaf_fetch": (BREAK_LEAF_FETCH, ("rule-a",), ()),
    "offload_norm_allreduce": (
        BREAK_OFFLOAD_NORM_ALLREDUCE,
        ("008-a",),
        ("-k", "008-a-offload", "--zero3-startup-timeout=1800"),
    ),
    "generation_backward_hooks": (BREAK_GENERATION_BACKWARD_HOOKS, ("006-c",), ()),
    "universal_hyperparams": (BREAK_UNIVERSAL_HYPERPARAMS, ("004-e",), ()),
    "shared_by_data_ptr": (BREAK_SHARED_BY_DATA_PTR, ("004-g",), ()),
    "reuse_scan_own": (BREAK_REUSE_SCAN_OWN, ("000-e",), ()),
    "gathered_depth": (BREAK_GATHERED_DEPTH, ("base-i",), ()),
    "hpz_secondary_update": (BREAK_HPZ_SECONDARY_UPDATE, ("007-b",), ("--zero3-profile=hpz",)),
    "hpz_load_invalidate": (BREAK_HPZ_LOAD_INVALIDATE, ("007-e",), ("--zero3-profile=hpz",)),
    "gather_single_param": (BREAK_GATHER_SINGLE_PARAM, ("007-d",), ()),
    "module_only_shards": (BREAK_MODULE_ONLY_SHARDS, ("008-d",), ("-k", "module-only")),
    "zero_load_optimizer": (BREAK_ZERO_LOAD_OPTIMIZER, ("008-i",), ("-k", "use_node_local_storage")),
    "coalesce_no_sync_reset": (BREAK_COALESCE_NO_SYNC_RESET, ("008-g",), ("-k", "coalesce")),
    "threshold_container": (BREAK_THRESHOLD_CONTAINER, ("base-j",), ()),
    "grad_norm_allreduce": (
        BREAK_GRAD_NORM_ALLREDUCE,
        ("008-h",),
        ("-k", "gradient_predivide_factor-no_reduce_scatter"),
    ),
    "numel_by_dims": (BREAK_NUMEL_BY_DIMS, ("008-f",), ("-k", "scalar", "--zero3-profile=zinit")),
    "init_module_trainable_only": (BREAK_INIT_MODULE_TRAINABLE_ONLY, ("002-g",), ("-k", "frozen-norms")),
    "hpz_group_rank": (BREAK_HPZ_GROUP_RANK, ("008-j",), ("-k", "zero_param_parallel_group")),
    "compile_fullgraph": (BREAK_COMPILE_FULLGRAPH, ("008-m",), ("--zero3-profile=compile",)),
    "tied_recovery": (BREAK_TIED_RECOVERY, ("seq-a",), ()),
    "ipg_exact_fit": (BREAK_IPG_EXACT_FIT, ("seq-a",), ()),
    "allreduce_fetch_unaligned": (BREAK_ALLREDUCE_FETCH_UNALIGNED, ("seq-a",), ()),
    "fetch_first_dtype": (BREAK_FETCH_FIRST_DTYPE, ("seq-a",), ()),
    "ckpt_name_local_rank": (BREAK_CKPT_NAME_LOCAL_RANK, ("seq-a",), ()),
    "offload_bounds_guard": (BREAK_OFFLOAD_BOUNDS_GUARD, ("seq-a",), ()),
    "modifier_persistent": (BREAK_MODIFIER_PERSISTENT, ("seq-a",), ()),
    "module_state_trainable_only": (BREAK_MODULE_STATE_TRAINABLE_ONLY, ("seq-a",), ()),
    "post_step_regather": (BREAK_POST_STEP_REGATHER, ("base-e",), ()),
    "allreduce_fetch_uninitialised": (
        BREAK_ALLREDUCE_FETCH_UNINITIALISED,
        ("base-d", "007-e"),
        ("--zero3-config=draw:1",),
    ),
}
