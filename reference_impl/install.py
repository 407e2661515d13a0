"""Swap the reference coordinator into the installed deepspeed, and take it out again.

``install()`` patches, in deepspeed:

* ``parameter_offload.PartitionedParameterCoordinator``: the name ``DeepSpeedZeRoOffload`` resolves
  when it builds its coordinator (it imported the class by name, so patching the defining module
  would change nothing);
* ``DeepSpeedZeRoOffload.__init__``: reads the adaptive-prefetch keys from the ds_config it is given
  and passes them, with its data-parallel group, to the coordinator constructor, whatever the class,
  when its constructor takes them (by name or ``**kwargs``; see ``pytest_zero3/protocol.py``); a
  class that does not gets the stock keywords only, with a rank-0 warning when adaptation is on; and
  it remembers the offload (weakly), whose coordinator ``GatheredParameters`` asks (below);
* ``parameter_offload.FWD_MODULE_STACK``: the global stack of running modules held every root module
  ever registered, so an engine's model (and through its hook closures the offload and coordinator)
  outlived ``engine.destroy()``. It becomes a stack of weak references; ``destroy()`` removes the
  root it pushed, and the end of backward (``release_backward_leftovers``) drops entries that
  early-stopped checkpoint recomputes pushed and never popped;
* ``GatheredParameters.__enter__``: first asks each coordinator to complete the all-gathers it has in
  flight for the params it is given (``complete_inflight``; between a forward and its backward the
  prefetches aimed at backward uses are in flight; contract 005-f).
  Stock gathers only NOT_AVAILABLE params and leaves an INFLIGHT one as it is: inside the context the
  user reads it empty (``torch.Size([0])`` at two ranks or more), on exit ``partition`` raises on it,
  and under ``unwrap_model_for_generation``, whose hook re-registration drains the in-flight
  gathers inside the context, ``enable_sanity_checks`` reports the params as modified in place;
* ``DeepSpeedZeRoOffload.partition_all_parameters`` (optimizer step, checkpoint save): accepts a
  param still gathered while an open ``GatheredParameters`` holds it (the coordinator keeps it), and
  skips plain params (a module attached after ``deepspeed.initialize``: stock reads their missing
  ``ds_status`` and raises at the first optimizer step);
* ``DeepSpeedZeroOptimizer_Stage3._load_universal_checkpoint``: also restores frozen params
  (:mod:`pytest_zero3.reference_impl.checkpoint`);
* ``DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks``: the gradient hook of a z3 leaf
  module fed an input without grad waits for the leaf's parameter gradients, which torch computes
  after it fires (:mod:`pytest_zero3.reference_impl.leaf`);
* ``DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue`` (after a checkpoint load or save): drops the
  hpZ secondary shard of every ZeRO-3 param of the module, frozen ones too, where stock's
  ``invalidate_secondary_tensor`` walks only the optimizer's groups: after ``load_checkpoint`` the next
  forward all-gathers a frozen param from its stale secondary shard, so a resumed model computes with
  the frozen weights it had before the load (contract 007-e under hpZ; DeepSpeed bug 8);
* ``get_zero_config`` (where ``DeepSpeedConfig`` resolves it): accepts and validates the
  ``stage3_adaptive_prefetch_*`` keys;
* ``groups._create_zero_param_parallel_group`` (hpZ's secondary-partition group, a process global):
  keeps a group of the asked size that an earlier ``zero.Init`` or engine made, where stock asserts
  that none exists, so a second model built under ``zero.Init`` with hpZ in one process (TRL's
  reference model) raises (DeepSpeed issue 4901; PR 8361, open, reuses the group alike).

Both functions are idempotent; ``uninstall()`` restores every original.
"""

import functools
import inspect
import weakref
from collections.abc import MutableSequence

import deepspeed.runtime.config as ds_runtime_config
import deepspeed.runtime.zero.config as ds_zero_config
import torch
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
from deepspeed.runtime.zero.partition_parameters import GatheredParameters
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from deepspeed.utils import groups

from .checkpoint import load_universal_with_frozen
from .config import adaptive_coordinator_kwargs, get_zero_config
from .coordinator import ReferenceCoordinator, held_by_gathered_parameters, warn_rank0
from .leaf import create_hooks_with_leaf_gate
from .trace import zero_params

_saved = {}  # original objects while installed; empty when not installed
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
        return original(self)

    return __enter__


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


def install(coordinator=ReferenceCoordinator) -> None:
    """Make deepspeed build ``coordinator`` (default :class:`ReferenceCoordinator`) for every later engine.

    The fixes around the coordinator (the weak module stack, the adaptive-prefetch config keys) are
    installed whatever the class, so that a coordinator given to pytest-zero3 as ``module:Class`` is
    judged on its own behaviour rather than on DeepSpeed's bugs elsewhere.
    """
    if _saved:
        parameter_offload.PartitionedParameterCoordinator = coordinator
        return
    _saved.update(
        coordinator=parameter_offload.PartitionedParameterCoordinator,
        stack=parameter_offload.FWD_MODULE_STACK,
        init=DeepSpeedZeRoOffload.__init__,
        destroy=DeepSpeedZeRoOffload.destroy,
        leftovers=DeepSpeedZeRoOffload.release_backward_leftovers,
        partition_all=DeepSpeedZeRoOffload.partition_all_parameters,
        gathered_enter=GatheredParameters.__enter__,
        universal=DeepSpeedZeroOptimizer_Stage3._load_universal_checkpoint,
        leaf_hooks=DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks,
        epilogue=DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue,
        runtime_get_zero_config=ds_runtime_config.get_zero_config,
        zero_get_zero_config=ds_zero_config.get_zero_config,
        hpz_group=groups._create_zero_param_parallel_group,
    )
    parameter_offload.PartitionedParameterCoordinator = coordinator
    parameter_offload.FWD_MODULE_STACK = WeakModuleStack(_saved["stack"])
    DeepSpeedZeRoOffload.__init__ = _offload_register(_offload_init(_saved["init"]))
    DeepSpeedZeRoOffload.destroy = _offload_destroy(_saved["destroy"])
    DeepSpeedZeRoOffload.release_backward_leftovers = _offload_release_backward_leftovers(_saved["leftovers"])
    DeepSpeedZeRoOffload.partition_all_parameters = _offload_partition_all_parameters
    GatheredParameters.__enter__ = _gathered_parameters_enter(_saved["gathered_enter"])
    DeepSpeedZeroOptimizer_Stage3._load_universal_checkpoint = load_universal_with_frozen(_saved["universal"])
    DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks = create_hooks_with_leaf_gate(
        _saved["leaf_hooks"]
    )
    DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue = _epilogue_invalidating_frozen(_saved["epilogue"])
    ds_runtime_config.get_zero_config = get_zero_config
    ds_zero_config.get_zero_config = get_zero_config
    groups._create_zero_param_parallel_group = _create_zero_param_parallel_group(_saved["hpz_group"])


def uninstall() -> None:
    """Restore deepspeed exactly as :func:`install` found it (live stack entries are kept)."""
    if not _saved:
        return
    parameter_offload.PartitionedParameterCoordinator = _saved["coordinator"]
    _saved["stack"][:] = list(parameter_offload.FWD_MODULE_STACK)
    parameter_offload.FWD_MODULE_STACK = _saved["stack"]
    DeepSpeedZeRoOffload.__init__ = _saved["init"]
    DeepSpeedZeRoOffload.destroy = _saved["destroy"]
    DeepSpeedZeRoOffload.release_backward_leftovers = _saved["leftovers"]
    DeepSpeedZeRoOffload.partition_all_parameters = _saved["partition_all"]
    GatheredParameters.__enter__ = _saved["gathered_enter"]
    DeepSpeedZeroOptimizer_Stage3._load_universal_checkpoint = _saved["universal"]
    DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks = _saved["leaf_hooks"]
    DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue = _saved["epilogue"]
    ds_runtime_config.get_zero_config = _saved["runtime_get_zero_config"]
    ds_zero_config.get_zero_config = _saved["zero_get_zero_config"]
    groups._create_zero_param_parallel_group = _saved["hpz_group"]
    _saved.clear()


def is_installed() -> bool:
    return bool(_saved)
