"""Swap the reference coordinator into the installed deepspeed, and take it out again.

:data:`PATCHES` is what ``install()`` changes in deepspeed, one row per attribute (its owner, the
attribute, the factory of the replacement, why, and the oldest DeepSpeed release the row applies to);
``install()`` applies the rows in order, ``uninstall()`` restores exactly what it replaced, in reverse
order.  Both functions are idempotent.
"""

import dataclasses
import functools
import inspect
import weakref
from collections.abc import MutableSequence
from typing import Any, Callable, Optional

import deepspeed.runtime.config as ds_runtime_config
import deepspeed.runtime.zero.config as ds_zero_config
import torch
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero import stage3 as ds_stage3
from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
from deepspeed.runtime.zero.partition_parameters import GatheredParameters, Init
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from deepspeed.utils import groups

from . import copies, fetch, fragments, module_only
from .checkpoint import load_universal_with_frozen
from .config import adaptive_coordinator_kwargs, get_zero_config
from .coordinator import ReferenceCoordinator, held_by_gathered_parameters, warn_rank0
from .leaf import create_hooks_with_leaf_gate
from .trace import zero_params

#: the ZeRO-3 offloads built while installed: GatheredParameters asks each one's coordinator to complete
#: the all-gathers it has in flight for the context's params
_offloads = weakref.WeakSet()


class WeakModuleStack(MutableSequence):
    """The running-module stack, holding modules by weak reference (collected modules vanish).

    Pushes and pops are O(1). An activation-checkpoint recompute that stops early (torch's default)
    aborts a forward whose post-hook then never pops, so entries pushed during a backward are
    remembered and dropped by :meth:`drop_backward_entries` once the backward is over.
    """

    def __init__(self, modules=()):
        self._entries = [(weakref.ref(m), False) for m in modules]  # (module ref, pushed in backward)

    def _live(self):
        self._entries = [e for e in self._entries if e[0]() is not None]
        return [ref() for ref, _ in self._entries]

    def _entry(self, module):
        return weakref.ref(module), torch._C._current_graph_task_id() != -1

    def __getitem__(self, index):
        if index == -1:  # the hot path: the innermost running module
            while self._entries and self._entries[-1][0]() is None:
                self._entries.pop()
            if not self._entries:
                raise IndexError("module stack is empty")
            return self._entries[-1][0]()
        return self._live()[index]

    def __setitem__(self, index, module):
        self._live()
        self._entries[index] = self._entry(module)

    def __delitem__(self, index):
        self._live()
        del self._entries[index]

    def __len__(self):
        return len(self._live())

    def insert(self, index, module):
        self._live()
        self._entries.insert(index, self._entry(module))

    def append(self, module):
        self._entries.append(self._entry(module))

    def pop(self, index=-1):
        module = self[index]
        del self._entries[index]
        return module

    def discard(self, module):
        self._entries = [e for e in self._entries if e[0]() is not None and e[0]() is not module]

    def drop_backward_entries(self):
        self._entries = [e for e in self._entries if e[0]() is not None and not e[1]]


ADAPTIVE_KEYWORDS = ("adaptive_prefetch", "adaptive_prefetch_min_sz", "adaptive_prefetch_max_sz", "dp_process_group")


def accepts_adaptive_keywords(factory) -> bool:
    """Whether a coordinator class takes the adaptive-prefetch keywords (by name, or ``**kwargs``)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return all(name in parameters for name in ADAPTIVE_KEYWORDS)


def _offload_init(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        factory = parameter_offload.PartitionedParameterCoordinator
        arguments = signature.bind(self, *args, **kwargs).arguments
        extra = adaptive_coordinator_kwargs(arguments.get("ds_config"))
        if not accepts_adaptive_keywords(factory):
            if extra["adaptive_prefetch"]:
                warn_rank0(
                    f"stage3_adaptive_prefetch_bucket_size is on, but {getattr(factory, '__name__', factory)} "
                    "does not take the adaptive_prefetch* keywords (pytest_zero3/protocol.py): the prefetch "
                    "bucket stays static"
                )
            return original(self, *args, **kwargs)
        extra["dp_process_group"] = arguments.get("dp_process_group")
        parameter_offload.PartitionedParameterCoordinator = functools.partial(factory, **extra)
        try:
            original(self, *args, **kwargs)
        finally:
            parameter_offload.PartitionedParameterCoordinator = factory

    return __init__


def _offload_register(original):

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _offloads.add(self)

    return __init__


def complete_inflight(params) -> None:
    """Ask the coordinator of every offload built while installed to complete the all-gathers it has in
    flight for ``params`` (``complete_inflight``, :class:`~.coordinator.ReferenceCoordinator`): the
    coordinator issued them, holds their handles and counts the params live, so it is the one to wait
    on them.  A coordinator class without the method is left as it is."""
    for offload in list(_offloads):
        complete = getattr(offload.get_param_coordinator(), "complete_inflight", None)
        if complete is not None:
            complete(params)


def _gathered_parameters_enter(original):

    @functools.wraps(original)
    def __enter__(self):
        if self.enabled:
            complete_inflight(self.params)
            self._persistent_gathered = [p for p in self.params if _persistent_and_gathered(p)]
        return original(self)

    return __enter__


def _persistent_and_gathered(param) -> bool:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return bool(getattr(param, "ds_persist", False)) and param.ds_status == ZeroParamStatus.AVAILABLE


def _gathered_exit_keeping_persistent(original):
    """Stock's exit partitions every param of the context, persistent ones too, and the coordinator counts
    on a persistent param it gathered staying gathered: DeepSpeed registers a param a block uses from
    another module as that block's external param only when the block's forward finds it partitioned,
    which a persistent one kept gathered never is, so nothing gathers it again before the backward that
    accumulates its gradient (unwrap_model_for_generation between a forward and its backward, where a
    block uses a persistent param of another module: the backward raised "The size of tensor a (0) must
    match").  A persistent param the context found gathered is gathered again on exit (one collective,
    every rank has the same persistent params gathered), so it leaves the param as it found it."""

    @functools.wraps(original)
    def exit_(self, *exc):
        try:
            return original(self, *exc)
        finally:
            kept = [p for p in getattr(self, "_persistent_gathered", ()) if not _persistent_and_gathered(p)]
            self._persistent_gathered = []
            if kept:
                kept[0].all_gather(param_list=kept)

    return exit_


def _offload_destroy(original):

    @functools.wraps(original)
    def destroy(self):
        original(self)
        # the reference coordinator's grad-mode probe is a root hook too: destroy() removes every hook
        probe = getattr(self.get_param_coordinator(), "_grad_probe", None)
        if probe is not None:
            probe.remove()
            self.get_param_coordinator()._grad_probe = None
        stack = parameter_offload.FWD_MODULE_STACK
        if isinstance(stack, WeakModuleStack):
            stack.discard(self.module)
        # each module's backward functions close over this offload and are built only where none exists:
        # left behind, a later wrap of the same model would run its backward hooks into this engine
        for module in self.module.modules():
            module.__dict__.pop("pre_bwd_fn", None)
            module.__dict__.pop("post_bwd_fn", None)
        copies.allow_module_copies(self.module)

    return destroy


def _offload_release_backward_leftovers(original):

    @functools.wraps(original)
    def release_backward_leftovers(self):
        original(self)
        stack = parameter_offload.FWD_MODULE_STACK
        if isinstance(stack, WeakModuleStack):
            stack.drop_backward_entries()

    return release_backward_leftovers


def _offload_partition_all_parameters(self):
    """DeepSpeed's, except that a param held by an open ``GatheredParameters`` may stay gathered, and a
    plain param (of a module attached after ``deepspeed.initialize``, contract 007-a) is not checked."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    self.get_param_coordinator().release_and_reset_all(self.module)
    for param in zero_params(self.module):
        if param.ds_status != ZeroParamStatus.NOT_AVAILABLE and not held_by_gathered_parameters(param):
            raise RuntimeError(f"{param.ds_summary()} expected to be released")


def _create_zero_param_parallel_group(original):

    @functools.wraps(original)
    def create(group_size):
        import deepspeed.comm as dist

        if groups._ZERO_PARAM_INTRA_PARALLEL_GROUP is not None:
            made = groups._get_zero_param_intra_parallel_group_world_size()
            if made == min(group_size, dist.get_world_size()):
                return None  # the group this size asks for: one per process serves every model
        return original(group_size)

    return create


def _epilogue_invalidating_frozen(original):
    @functools.wraps(original)
    def epilogue(self):
        # before the original, which all-gathers the persistent params (from a secondary shard if the
        # first of them still has one)
        for param in self.module.parameters():
            if getattr(param, "ds_secondary_tensor", None) is not None:
                param.ds_secondary_tensor = None
        return original(self)

    return epilogue


def _broadcast_model_with_scalars(original):
    """DeepSpeed broadcasts each param as bytes (``p.data.view(torch.uint8)``), which torch refuses for a
    0-dim tensor: a model with a scalar param (a layer scale, a temperature) failed in
    ``deepspeed.initialize`` (008-f, DeepSpeed bug 15).  Each 0-dim param is a 1-element view of the same
    storage for the original's broadcast, and 0-dim again after it."""

    @functools.wraps(original)
    def broadcast(self):
        scalars = [p for p in self.module.parameters() if p.dim() == 0]
        for p in scalars:
            p.data = p.data.view(1)
        try:
            return original(self)
        finally:
            for p in scalars:
                p.data = p.data.view(())

    return broadcast


def _gathered_exit_with_scalars(original):
    """``GatheredParameters`` with a ``modifier_rank`` broadcasts the modified params as bytes on exit, as
    :func:`_broadcast_model_with_scalars`; ``save_16bit_model`` takes that path, so the 16-bit export of a
    model with a 0-dim param raised (seq-a, DeepSpeed bug 15).  Each 0-dim param goes through a 1-element
    view of its storage, and is 0-dim again after (a param it partitioned is restored from ``ds_shape`` at
    its next gather)."""

    @functools.wraps(original)
    def exit_(self, *exc):
        scalars = [p for p in getattr(self, "params", ()) if p.dim() == 0]
        for p in scalars:
            p.data = p.data.view(1)
        try:
            return original(self, *exc)
        finally:
            for p in scalars:
                if p.data.numel() == 1 and p.data.dim() == 1:
                    p.data = p.data.view(())

    return exit_


def _zero_init_param_with_scalars(original):
    """zero.Init broadcasts each new param from the group's first rank as bytes before partitioning it,
    which raised for a 0-dim param, as :func:`_broadcast_model_with_scalars`; the broadcast of a 0-dim
    param goes through a 1-element view of its storage, the rest is the original's."""
    import deepspeed.comm as dist

    @functools.wraps(original)
    def init_param(self, param):
        if param.dim() != 0:
            return original(self, param)
        self._convert_to_deepspeed_param(param)
        group = self.get_partition_dp_group(param)
        src = 0 if dist.get_world_group() == group else dist.get_global_rank(group, 0)
        dist.broadcast(param.data.view(1).view(torch.uint8), src, group)
        param.partition()

    return init_param


def _coalesce_one_step(original):
    """``coalesce_grad_reduction``'s exit restored the boundary flag saved at its entry (None: the
    engine's own count), so the ``step()`` after the block stepped only where the count put a boundary:
    under ``gradient_accumulation_steps`` k, every k-th block (008-g, DeepSpeed bug 16).  One block is
    one optimizer step, as its docstring says: the flag stays True through the next ``step()``, which
    then restores it (:func:`_step_restoring_boundary`)."""
    import contextlib

    @contextlib.contextmanager
    def coalesce(self):
        with original(self):
            yield
        self._pz3_boundary_after_step = self._is_gradient_accumulation_boundary
        self._is_gradient_accumulation_boundary = True

    return functools.wraps(original)(coalesce)


def _step_restoring_boundary(original):
    """``step()``, then the boundary flag a coalesced block set for it put back (:func:`_coalesce_one_step`)."""

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            saved = self.__dict__.pop("_pz3_boundary_after_step", _ABSENT)  # None is a flag value
            if saved is not _ABSENT:
                self._is_gradient_accumulation_boundary = saved

    return step


def _backward_refusing_retained(original):
    """A second backward through one forward (``retain_graph=True``) crashed in it under stage 3, its
    params released by the first (``The size of tensor a (0) must match ...``; DeepSpeed issue 7352, open
    upstream): refused at the call instead, before anything ran, naming the issue.  A direct
    ``loss.backward(retain_graph=True)`` does not pass through here."""

    @functools.wraps(original)
    def backward(self, loss, retain_graph=False, *args, **kwargs):
        if retain_graph and self.zero_optimization_partition_weights():
            raise NotImplementedError(
                "engine.backward(retain_graph=True) under ZeRO stage 3: a second backward through the same "
                "forward needs its params gathered again, which stage 3 does not do (DeepSpeed issue 7352); "
                "run the forward again instead"
            )
        return original(self, loss, retain_graph, *args, **kwargs)

    return backward


def _predivided(world_of):
    """Stage 3 divides each gradient bucket by ``gradient_predivide_factor``, reduces it (averaging over
    the world), and multiplies by the factor again, but only where the factor is not the world size (a
    condition copied from the engine's all-reduce, whose post-multiply is factor/world and so 1 there):
    with the factor equal to the world size every gradient came out divided by it once more (008-h,
    DeepSpeed bug 17), on both of its reduction paths (contiguous gradients or not).  The partitions the
    original returns are multiplied by the factor where it skipped it.  ``world_of(self, first argument,
    dtype)``: the world size the original compares the factor with."""

    def wrap(original):
        @functools.wraps(original)
        def avg_scatter(self, to_reduce, communication_data_type):
            factor = self.gradient_predivide_factor
            if not self.postscale_gradients or factor == 1.0:
                return original(self, to_reduce, communication_data_type)
            world = world_of(self, to_reduce, communication_data_type)
            partitions = original(self, to_reduce, communication_data_type)
            if factor == world:
                for partition in partitions:
                    partition.mul_(factor)
            return partitions

        return avg_scatter

    return wrap


def _bucket_world(self, buffer, communication_data_type) -> int:
    import deepspeed.comm as dist

    bucket = self.ipg_buckets[communication_data_type]
    return self._gradient_averaging_world_size(bucket.params, dist.get_world_size(bucket.process_group))


def _params_world(self, params, communication_data_type) -> int:
    import deepspeed.comm as dist

    return dist.get_world_size(self._get_param_partition_group(params[0]))


def _init_casting_module(original):
    """``zero.Init(module=model, config_dict_or_path=config)`` partitions an already built model "as if
    it was constructed in the context", where every float tensor is made in the config's dtype; stock
    partitioned the params in the dtype they were built in, and the engine skips its own cast for a
    model whose params are already ZeRO params, so under bf16 the model's weights stayed fp32 and a bf16
    forward raised (008-j, DeepSpeed bug 18).  Marks the call so that :func:`_convert_casting` casts;
    only where the dtype comes from the config (the engine's own ``Init(module=..., dtype=...)`` of a
    model it has cast already is left alone)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs).arguments
        self._pz3_cast_module = (
            bound.get("module") is not None
            and bound.get("dtype") is None
            and bound.get("enabled", True)
            and (bound.get("config_dict_or_path") is not None or bound.get("config") is not None)
        )
        try:
            original(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_pz3_cast_module", None)

    return init


def _init_adopting_param_group(original):
    """``zero.Init(zero_param_parallel_group=G)``: stock gathers each param's secondary partition over
    ``G`` but sizes it (and picks this rank's slice) by DeepSpeed's own hpZ group, which none of its code
    has made before the first engine, so it read the whole world: at the first forward the all-gather
    over ``G`` got shards of the wrong size (008-j, DeepSpeed bug 19).  ``G`` becomes DeepSpeed's hpZ
    group where there is none yet (the engine then finds it rather than making another); one of another
    size already made is an error that names both."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        given = signature.bind(self, *args, **kwargs).arguments.get("zero_param_parallel_group")
        if given is not None:
            import deepspeed.comm as dist

            made = groups._ZERO_PARAM_INTRA_PARALLEL_GROUP
            if made is None:
                groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = given
            elif dist.get_world_size(group=made) != dist.get_world_size(group=given):
                raise ValueError(
                    f"zero.Init(zero_param_parallel_group=...) got a group of {dist.get_world_size(group=given)} "
                    f"ranks, but DeepSpeed's hpZ group of this process has {dist.get_world_size(group=made)} "
                    "(zero_hpz_partition_size): give a group of that size, or none"
                )
        return original(self, *args, **kwargs)

    return init


def _save_with_latest_per_node(original):
    """Under ``checkpoint.use_node_local_storage`` every node writes its own copy of the checkpoint, but
    stock wrote the ``latest`` file on global rank 0 only: on every other node a resume without a tag
    (HF's Trainer's) found no ``latest``, warned, and skipped the load, so those ranks trained on from
    their initial weights beside ranks that loaded (008-i, DeepSpeed bug 20).  Each node's local rank 0
    writes it too (the synchronous checkpoint engine's commit; a decoupled one commits later)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def save(self, *args, **kwargs):
        done = original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        writes_here = self.use_node_local_storage() and self.local_rank == 0 and self.global_rank != 0
        decoupled = getattr(self.checkpoint_engine, "is_decoupled", lambda: False)()
        if writes_here and given.get("save_latest", True) and not decoupled:
            import os

            tag = given.get("tag")
            with open(os.path.join(given["save_dir"], "latest"), "w") as fd:
                fd.write(str(tag if tag is not None else f"global_step{self.global_steps}"))
        if self.use_node_local_storage():  # as stock's save ends: every rank returns after every write
            import deepspeed.comm as dist

            dist.barrier()
        return done

    return save


def _offload_states_by_partition(original):
    """``offload_states`` moves the optimizer's flat buffer of 16-bit partitions (``lp_params``) to the host
    and points each param's partition into the moved buffer; stock pointed every param of the module, by
    the module's order, frozen params included, which the buffer does not hold: with any frozen param
    the offsets ran past its end (a RuntimeError, seq-a, DeepSpeed bug 23).  The original moves every
    other kind; ``lp_params`` is moved here as stock moves it, each of the buffer's own params (the
    optimizer's, in its order: what ``reload_states`` points back) pointed into it."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum
    from deepspeed.runtime.zero.utils import get_mapping_to_flat_buffer

    @functools.wraps(original)
    def offload_states(self, include=None, device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False):
        lp = OffloadStateTypeEnum.lp_params
        if lp in self.offloaded_states or (include is not None and lp not in include):
            return original(self, include, device, pin_memory, non_blocking)
        rest = [kind for kind in (list(OffloadStateTypeEnum) if include is None else include) if kind != lp]
        original(self, rest, device, pin_memory, non_blocking)
        if pin_memory:
            if not hasattr(self, "lp_param_contiguous_pin_buffer"):
                self.lp_param_contiguous_pin_buffer = get_accelerator().pin_memory(
                    torch.empty_like(self.lp_param_buffer, device=device.value)
                )
            self.lp_param_contiguous_pin_buffer.copy_(self.lp_param_buffer, non_blocking=non_blocking)
            moved = self.lp_param_contiguous_pin_buffer
        else:
            moved = self.lp_param_buffer.to(device.value, non_blocking=non_blocking)
        self.lp_param_buffer.data = moved
        for tensor, offset, numel in get_mapping_to_flat_buffer(self._get_parameter_partitions()):
            tensor.data = moved.narrow(0, offset, numel)
        self.fp16_partitioned_groups_flat.clear()
        self.offloaded_states.add(lp)

    return offload_states


def _module_state_dict_without_frozen_aliases(original):
    """``module_state_dict(exclude_frozen_parameters=True)`` dropped the names ``named_parameters()`` gives,
    one per param: a frozen param tied under a second name (a frozen embedding tied to the head) stayed
    in under that name, where ``save_16bit_model`` and ``zero_to_fp32`` with the same option leave it out
    (seq-a, DeepSpeed bug 24).  Every name of a frozen param is dropped."""

    @functools.wraps(original)
    def module_state_dict(self, destination=None, prefix="", keep_vars=False, exclude_frozen_parameters=False):
        sd = original(self, destination, prefix, keep_vars, exclude_frozen_parameters)
        if exclude_frozen_parameters:
            for name, param in self.module.named_parameters(remove_duplicate=False):
                if not param.requires_grad:
                    sd.pop(prefix + name, None)
        return sd

    return module_state_dict


def _convert_casting(original):
    """Under a call :func:`_init_casting_module` marked, the module's float params not yet partitioned
    are cast to Init's dtype (the config's) before they are partitioned."""

    @functools.wraps(original)
    def convert(self, param_list):
        params = list(param_list)
        if self.__dict__.get("_pz3_cast_module"):
            for p in params:
                if not hasattr(p, "ds_id") and p.is_floating_point() and p.dtype != self.dtype:
                    p.data = p.data.to(self.dtype)
        return original(self, params)

    return convert


def _keep_live_entries(original, installed) -> None:
    """Uninstalling the weak stack: the original list takes the modules still on it."""
    original[:] = list(installed)


def _convert_fetching_by_dtype(original):
    """``Init._convert_to_deepspeed_param``: under ``stage3_use_all_reduce_for_fetch_params`` the param's
    ``all_gather_coalesced`` fetches its params grouped by the dtype each is stored in and the one it travels
    in, each group all-reduced in the latter (:mod:`reference_impl.fetch`): stock builds one flat buffer in the
    one dtype of all the fetch's partitions, which raises where there are two (a frozen bf16 base beside fp32
    adapters: seq-a, DeepSpeed bug 22) and gathers ``torch_autocast``'s params in the weights' dtype where two
    or more are fetched together, in the autocast dtype where one is (bug 25)."""

    @functools.wraps(original)
    def convert(self, param):
        original(self, param)
        param.all_gather_coalesced = fetch.by_dtypes(self, param.all_gather_coalesced)

    return convert


def _wrapper(wrap: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """A row's factory that wraps the original: ``wrap(original)``."""
    return lambda original, coordinator: wrap(original)


def _replacement(value) -> Callable[[Any, Any], Any]:
    """A row's factory that puts ``value`` in place of the original."""
    return lambda original, coordinator: value


def _registering_eager_hooks(register_grad_hook):
    """``deepspeed.runtime.zero.stage3.register_grad_hook`` registering each hook wrapped in
    ``torch.compiler.disable``: dynamo (compiled autograd's too) never traces a gradient hook."""

    @functools.wraps(register_grad_hook)
    def register(param, hook):
        return register_grad_hook(param, torch.compiler.disable(hook))

    return register


def _registering_eager_module_hooks(original):
    """``DeepSpeedZeRoOffload._register_deepspeed_module`` with every module hook it registers wrapped in
    ``torch.compiler.disable``, as stock already wraps the pre-forward and post-backward ones.

    The post-forward and pre-backward hooks compute nothing a graph could hold (a pop of the module
    stack, external-param bookkeeping, the release, an autograd function put on the outputs), and the
    release they reach is excluded from compilation anyway.  Traced, dynamo guards them on each module's
    type and ``ds_id`` (read by a debug message's f-string) and recompiles them per module until its
    recompile limit, after which it runs them eagerly: a compiled world traced them 90 more times for
    nothing (007-c and base-a under the ``compile`` profile: 135 recompiles to 45)."""

    @functools.wraps(original)
    def _register_deepspeed_module(self, *args, **kwargs):
        first = (len(self.forward_hooks), len(self.backward_hooks))
        original(self, *args, **kwargs)
        for handles, start in zip((self.forward_hooks, self.backward_hooks), first):
            for handle in handles[start:]:
                hooks = handle.hooks_dict_ref()
                hook = None if hooks is None else hooks.get(handle.id)
                if hook is not None and not getattr(hook, "_torchdynamo_disable", False):
                    hooks[handle.id] = torch.compiler.disable(hook)

    return _register_deepspeed_module


@dataclasses.dataclass(frozen=True)
class Patch:
    """One attribute ``install()`` replaces in deepspeed."""

    owner: Any  # the module or class that holds the attribute
    attribute: str
    #: ``factory(original, coordinator)``: what install sets (``coordinator``: the class install was given)
    factory: Callable[[Any, Any], Any]
    why: str
    #: the oldest deepspeed release the row applies to (skipped on older ones); None: every release the
    #: reference runs on (``pytest_zero3.impl.MIN_DEEPSPEED_REFERENCE``)
    since: Optional[str] = None
    #: ``restore(original, installed)``, called before uninstall puts the original back
    restore: Optional[Callable[[Any, Any], None]] = None


#: What install() changes, in the order it changes it.  Every row applies whatever the coordinator class
#: (the first row), so that a coordinator given to pytest-zero3 as ``module:Class`` is judged on its own
#: behaviour rather than on DeepSpeed's bugs elsewhere.
PATCHES = (
    Patch(
        parameter_offload,
        "PartitionedParameterCoordinator",
        lambda original, coordinator: coordinator,
        "the name DeepSpeedZeRoOffload resolves when it builds its coordinator: it imported the class by "
        "name, so patching the defining module would change nothing",
    ),
    Patch(
        parameter_offload,
        "FWD_MODULE_STACK",
        _wrapper(WeakModuleStack),
        "the global stack of running modules held every root module ever registered, so an engine's model "
        "(and through its hook closures the offload and coordinator) outlived engine.destroy() (001-a); it "
        "holds them weakly, destroy() removes the root it pushed, and the end of backward drops what "
        "early-stopped checkpoint recomputes pushed and never popped",
        restore=_keep_live_entries,
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "__init__",
        _wrapper(lambda init: _offload_register(_offload_init(init))),
        "passes the stage3_adaptive_prefetch_* keys and the data-parallel group to a coordinator class "
        "whose constructor takes them (pytest_zero3/protocol.py; a rank-0 warning for one that does not "
        "while adaptation is on), and remembers the offload (weakly) for GatheredParameters",
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "setup_zero_stage3_hooks",
        _wrapper(copies.refuse_module_copies),
        "copy.deepcopy(engine.module) gave a copy that carries the engine's hooks: with partitioned params it "
        "held empty placeholders, with every param gathered (persistent ones) the weights, and either way its "
        "forward drove the engine's coordinator and raised; every module the engine hooks refuses the copy "
        "at the call, naming it (reference_impl/copies.py, 008-e and seq-a, DeepSpeed bug 13)",
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "_register_deepspeed_module",
        _wrapper(_registering_eager_module_hooks),
        "engine.compile(): dynamo traced the post-forward and pre-backward module hooks, which hold no graph, "
        "and recompiled them per module (type, ds_id) until its recompile limit; they run eagerly, as stock "
        "already runs the pre-forward and post-backward ones",
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "destroy",
        _wrapper(_offload_destroy),
        "also removes the reference coordinator's grad-mode probe hook, the root's entry in the weak module stack, "
        "every module's backward functions, which close over this offload (a later wrap of the same model "
        "reused them and ran its backward hooks into the destroyed engine, 006-c), and the modules' refusal of "
        "copy.deepcopy",
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "release_backward_leftovers",
        _wrapper(_offload_release_backward_leftovers),
        "end of backward (DeepSpeed 0.19.3 on): also drops the module-stack entries that early-stopped "
        "checkpoint recomputes pushed and never popped",
    ),
    Patch(
        DeepSpeedZeRoOffload,
        "partition_all_parameters",
        _replacement(_offload_partition_all_parameters),
        "optimizer step, checkpoint save: accepts a param still gathered while an open GatheredParameters "
        "holds it (the coordinator keeps it), and skips plain params of a module attached after "
        "deepspeed.initialize (stock reads their missing ds_status and raises at the first step, 007-a)",
    ),
    Patch(
        GatheredParameters,
        "__enter__",
        _wrapper(_gathered_parameters_enter),
        "first asks each coordinator to complete the all-gathers it has in flight for the context's params "
        "(complete_inflight, 005-f): stock leaves an INFLIGHT param as it is, read empty inside the "
        "context at two ranks or more and unpartitionable on exit",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "_load_universal_checkpoint",
        _wrapper(load_universal_with_frozen),
        "also restores frozen params (reference_impl/checkpoint.py)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "create_reduce_and_remove_grad_hooks",
        _wrapper(create_hooks_with_leaf_gate),
        "the gradient hook of a z3 leaf module fed an input without grad waits for the leaf's parameter "
        "gradients, which torch computes after it fires (reference_impl/leaf.py, base-j)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "checkpoint_event_epilogue",
        _wrapper(_epilogue_invalidating_frozen),
        "after a checkpoint load or save, drops the hpZ secondary shard of every ZeRO-3 param of the "
        "module, frozen ones too (stock walks only the optimizer's groups, so a resumed model computed "
        "with the frozen weights it had before the load: 007-e under hpZ, DeepSpeed bug 8)",
    ),
    Patch(
        ds_runtime_config,
        "get_zero_config",
        _replacement(get_zero_config),
        "where DeepSpeedConfig resolves it: accepts and validates the stage3_adaptive_prefetch_* keys",
    ),
    Patch(
        ds_zero_config,
        "get_zero_config",
        _replacement(get_zero_config),
        "the defining module's name, which runtime/config.py imported (any later importer gets the reference's too)",
    ),
    Patch(
        groups,
        "_create_zero_param_parallel_group",
        _wrapper(_create_zero_param_parallel_group),
        "hpZ's secondary-partition group is a process global: keeps one of the asked size that an earlier "
        "zero.Init or engine made, where stock asserts none exists, so a second model built under "
        "zero.Init with hpZ in one process (TRL's reference model) raised (DeepSpeed issue 4901; PR 8361)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "_get_fp32_grad_state_partition",
        _wrapper(fragments.grad_partition),
        "with the optimizer offloaded, the tensor-fragment reads and writes between the micro-batches of a "
        "step reached the host copy, which holds the last boundary's gradient (contract 008-a)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "set_fp32_grad_for_param",
        _replacement(fragments.set_fp32_grad_for_param),
        "safe_set_full_grad raised on the last ranks of a param whose size does not divide by the world size, "
        "and under an offloaded optimizer left the clipping norm of the gradient it replaced (008-b)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "set_full_hp_param",
        _replacement(fragments.set_full_hp_param),
        "safe_set_full_fp32_param and safe_set_full_optimizer_state raised on the last ranks of a param whose "
        "size does not divide by the world size (008-b)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "update_fp32_grad_for_param_vectorized",
        _replacement(fragments.update_fp32_grad_for_param_vectorized),
        "safe_update_full_grad_vectorized raised on the last rank of an odd-sized param in the middle of its "
        "all-gathers, which the other ranks then waited in (008-b, DeepSpeed bug 10's cut at another site)",
    ),
    Patch(
        Init,
        "_convert_to_deepspeed_param",
        _wrapper(lambda convert: _convert_fetching_by_dtype(copies.convert_refusing_deepcopy(convert))),
        "copy.deepcopy of a partitioned param (a zero.Init model copied before deepspeed.initialize) gave an "
        "empty plain Parameter, a copy with no weights; it is refused at the call, naming the param "
        "(reference_impl/copies.py, 008-e, DeepSpeed bug 13).  And under stage3_use_all_reduce_for_fetch_params "
        "a fetch of params of two dtypes (fp32 adapters beside a frozen bf16 base) raised 'expected there to be "
        "only one unique element' (seq-a, DeepSpeed bug 22), and under torch_autocast a fetch of two or more "
        "params gathered the autocast's params in the weights' dtype, of one param in the autocast dtype (the "
        "forward's values followed the fetch's batching: bug 25); it fetches each dtype pair by an all-reduce "
        "in the dtype the params travel in (reference_impl/fetch.py)",
    ),
    Patch(
        DeepSpeedEngine,
        "_load_checkpoint",
        _wrapper(module_only.load_module_only_weights),
        "load_checkpoint(load_module_only=True) with the default load_optimizer_states=True loaded the saved "
        "module state dict, whose ZeRO-3 params are empty placeholders: the engine kept its initial weights; "
        "module only now loads the consolidated weights, as load_optimizer_states=False does "
        "(reference_impl/module_only.py, 008-d, DeepSpeed bug 14)",
    ),
    Patch(
        DeepSpeedEngine,
        "save_checkpoint",
        _wrapper(_save_with_latest_per_node),
        "under checkpoint.use_node_local_storage only global rank 0 wrote 'latest', so a resume without a tag "
        "skipped the load on every other node (a warning) and those ranks trained on from their initial "
        "weights; each node's local rank 0 writes it (008-i, DeepSpeed bug 20)",
    ),
    Patch(
        DeepSpeedEngine,
        "_broadcast_model",
        _wrapper(_broadcast_model_with_scalars),
        "deepspeed.initialize raised on a model with a 0-dim param (its broadcast views every param as bytes, "
        "which torch refuses for a 0-dim tensor); each one is broadcast as a 1-element view (008-f, DeepSpeed "
        "bug 15)",
    ),
    Patch(
        GatheredParameters,
        "__exit__",
        _wrapper(lambda exit_: _gathered_exit_keeping_persistent(_gathered_exit_with_scalars(exit_))),
        "the same for GatheredParameters' broadcast on exit with a modifier_rank (save_16bit_model's path): "
        "a 0-dim param is broadcast as a 1-element view (seq-a, DeepSpeed bug 15); and a persistent param the "
        "context found gathered is gathered again after the exit partitioned it (a block's use of another "
        "module's persistent param is then never registered as external, so its backward would not gather it)",
    ),
    Patch(
        Init,
        "_zero_init_param",
        _wrapper(_zero_init_param_with_scalars),
        "the same for zero.Init's broadcast of each new param (every model under zero.Init, and every model "
        "deepspeed.initialize partitions): a 0-dim param is broadcast as a 1-element view (008-f, DeepSpeed "
        "bug 15)",
    ),
    Patch(
        Init,
        "__init__",
        _wrapper(lambda init: _init_adopting_param_group(_init_casting_module(init))),
        "zero.Init(module=model) under a bf16 config partitioned the model's params in the dtype they were "
        "built in, and the engine skips its cast for ZeRO params: the weights stayed fp32 and a bf16 forward "
        "raised; they are cast to the config's dtype, as a model built in the context is (008-j, DeepSpeed "
        "bug 18).  zero.Init(zero_param_parallel_group=G) sized hpZ's secondary partitions by DeepSpeed's "
        "own group (none yet: the whole world) and gathered them over G, so the first forward raised; G "
        "becomes that group (008-j, DeepSpeed bug 19)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "offload_states",
        _wrapper(_offload_states_by_partition),
        "offload_states pointed every param of the module into the moved buffer of the optimizer's 16-bit "
        "partitions, frozen params included, which it does not hold: with any frozen param it raised (seq-a, "
        "DeepSpeed bug 23); the buffer's own params are pointed into it",
    ),
    Patch(
        DeepSpeedEngine,
        "module_state_dict",
        _wrapper(_module_state_dict_without_frozen_aliases),
        "module_state_dict(exclude_frozen_parameters=True) kept a frozen param under its tied name, which the "
        "16-bit export and zero_to_fp32 with the same option leave out (seq-a, DeepSpeed bug 24)",
    ),
    Patch(
        Init,
        "_convert_to_zero_parameters",
        _wrapper(_convert_casting),
        "casts the params of the module handed to zero.Init(module=...) (the row above marks the call)",
    ),
    Patch(
        DeepSpeedEngine,
        "coalesce_grad_reduction",
        _wrapper(_coalesce_one_step),
        "under gradient accumulation the step() after a coalesced block stepped only every k-th block (the "
        "block's exit restored the boundary flag saved at its entry); one block is one step (008-g, DeepSpeed "
        "bug 16)",
        since="0.19.2",
    ),
    Patch(
        DeepSpeedEngine,
        "step",
        _wrapper(_step_restoring_boundary),
        "puts back the boundary flag a coalesced block set for this step (008-g)",
        since="0.19.2",
    ),
    Patch(
        ds_stage3,
        "register_grad_hook",
        lambda original, coordinator: _registering_eager_hooks(original),
        "under engine.compile(compiled_autograd_enabled=True) compiled autograd traced stage 3's "
        "post-accumulate-grad hook with dynamo, whose fake copy of the partitioned param (1-D, its grad "
        "2-D) raised 'AssertionError: 1 != 2' in the first backward; the hook runs eagerly, a graph break "
        "in the compiled backward (docs/repro/compiled_autograd_hook.py); the wrapper costs 0.4 us a hook call",
    ),
    Patch(
        DeepSpeedEngine,
        "backward",
        _wrapper(_backward_refusing_retained),
        "backward(retain_graph=True) under stage 3 crashed in the second backward (DeepSpeed issue 7352); "
        "refused at the call, naming the issue (008-g)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_contiguous_grads",
        _wrapper(_predivided(_bucket_world)),
        "without reduce-scatter, a gradient_predivide_factor equal to the world size divided every gradient "
        "by it once more (the multiply back was skipped there); the partitions get it (008-h, DeepSpeed bug 17)",
    ),
    Patch(
        DeepSpeedZeroOptimizer_Stage3,
        "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads",
        _wrapper(_predivided(_params_world)),
        "the same skipped multiply on the reduction path without contiguous gradients (008-h under a drawn "
        "config with contiguous_gradients off, DeepSpeed bug 17)",
    ),
)

_ABSENT = object()  # the attribute was not the owner's own (inherited): uninstall deletes it again
#: ``(patch, original, the owner's own value)`` for each row install applied, in order; empty when not
#: installed
_saved: list = []


def _applies(patch: Patch) -> bool:
    if patch.since is None:
        return True
    import deepspeed
    from packaging.version import Version

    return Version(deepspeed.__version__) >= Version(patch.since)


def install(coordinator=ReferenceCoordinator) -> None:
    """Make deepspeed build ``coordinator`` (default :class:`ReferenceCoordinator`) for every later engine,
    with every row of :data:`PATCHES` applied.  Installed already: only the coordinator changes."""
    if _saved:
        parameter_offload.PartitionedParameterCoordinator = coordinator
        return
    rows = [patch for patch in PATCHES if _applies(patch)]
    # every original first: a row whose attribute is missing raises before anything changes
    originals = [getattr(patch.owner, patch.attribute) for patch in rows]
    for patch, original in zip(rows, originals):
        _saved.append((patch, original, vars(patch.owner).get(patch.attribute, _ABSENT)))
        setattr(patch.owner, patch.attribute, patch.factory(original, coordinator))


def uninstall() -> None:
    """Restore deepspeed exactly as :func:`install` found it (live stack entries are kept)."""
    while _saved:
        patch, original, own = _saved.pop()
        if patch.restore is not None:
            patch.restore(original, getattr(patch.owner, patch.attribute))
        if own is _ABSENT:
            delattr(patch.owner, patch.attribute)
        else:
            setattr(patch.owner, patch.attribute, own)


def is_installed() -> bool:
    return bool(_saved)
