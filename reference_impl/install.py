"""Swap the reference coordinator into the installed deepspeed, and take it out again.

``install()`` patches, in deepspeed:

* ``parameter_offload.PartitionedParameterCoordinator``: the name ``DeepSpeedZeRoOffload`` resolves
  when it builds its coordinator (it imported the class by name, so patching the defining module
  would change nothing);
* ``DeepSpeedZeRoOffload.__init__``: reads the adaptive-prefetch keys from the ds_config it is given
  and passes them, with its data-parallel group, to the coordinator constructor;
* ``parameter_offload.FWD_MODULE_STACK``: the global stack of running modules held every root module
  ever registered, so an engine's model (and through its hook closures the offload and coordinator)
  outlived ``engine.destroy()``. It becomes a stack of weak references, and ``destroy()`` removes the
  root it pushed;
* ``get_zero_config`` (where ``DeepSpeedConfig`` resolves it): accepts and validates the
  ``stage3_adaptive_prefetch_*`` keys.

Both functions are idempotent; ``uninstall()`` restores every original.
"""

import functools
import inspect
import weakref
from collections.abc import MutableSequence

import deepspeed.runtime.config as ds_runtime_config
import deepspeed.runtime.zero.config as ds_zero_config
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

from .config import adaptive_coordinator_kwargs, get_zero_config
from .coordinator import ReferenceCoordinator

_saved = {}  # original objects while installed; empty when not installed


class WeakModuleStack(MutableSequence):
    """A list of modules that does not keep them alive; entries of collected modules vanish."""

    def __init__(self, modules=()):
        self._refs = [weakref.ref(m) for m in modules]

    def _live(self):
        self._refs = [r for r in self._refs if r() is not None]
        return [r() for r in self._refs]

    def __getitem__(self, index):
        return self._live()[index]

    def __setitem__(self, index, module):
        self._live()
        self._refs[index] = weakref.ref(module)

    def __delitem__(self, index):
        self._live()
        del self._refs[index]

    def __len__(self):
        return len(self._live())

    def insert(self, index, module):
        self._live()
        self._refs.insert(index, weakref.ref(module))

    def discard(self, module):
        self._refs = [r for r in self._refs if r() is not None and r() is not module]


def _offload_init(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        factory = parameter_offload.PartitionedParameterCoordinator
        if not (isinstance(factory, type) and issubclass(factory, ReferenceCoordinator)):
            return original(self, *args, **kwargs)  # someone else's coordinator is in place
        arguments = signature.bind(self, *args, **kwargs).arguments
        extra = adaptive_coordinator_kwargs(arguments.get("ds_config"))
        extra["dp_process_group"] = arguments.get("dp_process_group")
        parameter_offload.PartitionedParameterCoordinator = functools.partial(factory, **extra)
        try:
            original(self, *args, **kwargs)
        finally:
            parameter_offload.PartitionedParameterCoordinator = factory

    return __init__


def _offload_destroy(original):

    @functools.wraps(original)
    def destroy(self):
        original(self)
        stack = parameter_offload.FWD_MODULE_STACK
        if isinstance(stack, WeakModuleStack):
            stack.discard(self.module)

    return destroy


def install() -> None:
    """Make deepspeed build :class:`ReferenceCoordinator` for every subsequent engine."""
    if _saved:
        return
    _saved.update(coordinator=parameter_offload.PartitionedParameterCoordinator,
                  stack=parameter_offload.FWD_MODULE_STACK,
                  init=DeepSpeedZeRoOffload.__init__,
                  destroy=DeepSpeedZeRoOffload.destroy,
                  runtime_get_zero_config=ds_runtime_config.get_zero_config,
                  zero_get_zero_config=ds_zero_config.get_zero_config)
    parameter_offload.PartitionedParameterCoordinator = ReferenceCoordinator
    parameter_offload.FWD_MODULE_STACK = WeakModuleStack(_saved["stack"])
    DeepSpeedZeRoOffload.__init__ = _offload_init(_saved["init"])
    DeepSpeedZeRoOffload.destroy = _offload_destroy(_saved["destroy"])
    ds_runtime_config.get_zero_config = get_zero_config
    ds_zero_config.get_zero_config = get_zero_config


def uninstall() -> None:
    """Restore deepspeed exactly as :func:`install` found it (live stack entries are kept)."""
    if not _saved:
        return
    parameter_offload.PartitionedParameterCoordinator = _saved["coordinator"]
    _saved["stack"][:] = list(parameter_offload.FWD_MODULE_STACK)
    parameter_offload.FWD_MODULE_STACK = _saved["stack"]
    DeepSpeedZeRoOffload.__init__ = _saved["init"]
    DeepSpeedZeRoOffload.destroy = _saved["destroy"]
    ds_runtime_config.get_zero_config = _saved["runtime_get_zero_config"]
    ds_zero_config.get_zero_config = _saved["zero_get_zero_config"]
    _saved.clear()


def is_installed() -> bool:
    return bool(_saved)
