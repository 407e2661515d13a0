"""The coordinator protocol: what DeepSpeed's ZeRO-3 engine calls on a parameter coordinator.

Read off deepspeed 0.19.8 (``runtime/zero/parameter_offload.py`` constructs the coordinator and its
module hooks drive it; ``stage3.py`` calls ``release_backward_leftovers`` at the end of backward and
sets ``hierarchy`` in ``step``).  :class:`Coordinator` is the one statement of it: mypy checks the
reference (:class:`~pytest_zero3.reference_impl.ReferenceCoordinator`) against it (the block at the
end of this module), and a class given as ``--zero3-impl=module:Class`` is checked against its
methods (:func:`missing_methods`) before any world starts.

Implementations of the adaptive prefetch bucket (contract family 003) also accept the keywords of
:class:`AdaptiveCoordinatorClass`: under ``--zero3-impl=module:Class`` any class whose constructor
names all four (or takes ``**kwargs``) gets them from the ``stage3_adaptive_prefetch_*`` config keys;
any other class is built with the keywords of :class:`CoordinatorClass` only (a rank-0 warning says
so when adaptation is on).

Not DeepSpeed's: with the reference's fixes installed, ``GatheredParameters`` calls
``complete_inflight(params)`` on a coordinator that defines it, as the context opens, to complete the
all-gathers it has in flight for those params (contract 005-f).  A class without it is left as it is.

Modules and params are torch's ``nn.Module`` and ``nn.Parameter``; they are typed ``Any`` here, as
mypy does not follow torch (pyproject.toml) and this module imports neither torch nor deepspeed.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol


class Coordinator(Protocol):
    """What DeepSpeed's hooks and optimizer call on the coordinator, and what each call means."""

    #: written by ``stage3.step()``
    hierarchy: int

    def reset_step(self) -> None:
        """End of a forward/backward iteration: drain prefetches, finish recording the trace."""

    def trace_prologue(self, module: Any) -> None:
        """Before a module runs: check it against the recorded trace."""

    def is_record_trace(self) -> bool:
        """Whether the trace is being recorded this iteration."""

    def is_complete_trace(self) -> bool:
        """Whether a complete trace exists (prefetch may follow it)."""

    def is_invalid_trace(self) -> bool:
        """Whether no usable trace exists."""

    def _invalidate_trace(self) -> None:
        """Drop the trace and everything derived from it (hooks re-registered on the root module)."""

    def record_module(self, module: Any) -> None:
        """Append a module to the trace being recorded."""

    def fetch_sub_module(self, module: Any, forward: bool) -> None:
        """Make the module's params available (``forward`` passed by name)."""

    def release_sub_module(self, module: Any, forward: bool) -> None:
        """Release what is not reused within the reuse distance (``forward`` passed by name)."""

    def release_and_reset_all(self, module: Any) -> None:
        """Partition every param of the module tree (optimizer step, checkpointing)."""

    def release_backward_leftovers(self) -> None:
        """End of backward: release params gathered for checkpoint recompute and modules whose
        post-backward hook never fired (DeepSpeed 0.19.3 and later, the oldest a coordinator class
        runs on: ``impl.MIN_DEEPSPEED_REFERENCE``)."""


class CoordinatorClass(Protocol):
    """The constructor: ``DeepSpeedZeRoOffload`` passes every keyword by name (``allgather_stream`` is
    None on CPU)."""

    def __call__(
        self,
        *,
        prefetch_bucket_sz: int,
        max_reuse_distance_in_numel: int,
        max_available_parameters_in_numel: int,
        allgather_stream: Any,
        inflight_param_registry: Any,
        prefetch_nvme: bool,
        timers: Any,
        zero_quantized_weights: bool,
        zero_quantized_nontrainable_weights: bool,
        fast_sharding_for_leaf_module: bool,
        log_trace_cache_warnings: bool,
    ) -> Coordinator: ...


class AdaptiveCoordinatorClass(Protocol):
    """The constructor of a coordinator with an adaptive prefetch bucket: :class:`CoordinatorClass`'s
    keywords and these four, from the ``stage3_adaptive_prefetch_*`` config keys and the offload's
    data-parallel group (``reference_impl.install`` passes them)."""

    def __call__(
        self,
        *,
        prefetch_bucket_sz: int,
        max_reuse_distance_in_numel: int,
        max_available_parameters_in_numel: int,
        allgather_stream: Any,
        inflight_param_registry: Any,
        prefetch_nvme: bool,
        timers: Any,
        zero_quantized_weights: bool,
        zero_quantized_nontrainable_weights: bool,
        fast_sharding_for_leaf_module: bool,
        log_trace_cache_warnings: bool,
        adaptive_prefetch: bool,
        adaptive_prefetch_min_sz: int,
        adaptive_prefetch_max_sz: int,
        dp_process_group: Any,
    ) -> Coordinator: ...


#: The methods of :class:`Coordinator`, in the order it declares them.
METHODS = tuple(
    name
    for name, value in vars(Coordinator).items()
    if inspect.isfunction(value) and not (name.startswith("__") and name.endswith("__"))
)


def missing_methods(cls) -> list:
    """Names from :data:`METHODS` that ``cls`` does not define as callables."""
    return [name for name in METHODS if not callable(getattr(cls, name, None))]


if TYPE_CHECKING:
    # The reference conforms (mypy, in CI).  mypy reads the checkout's reference_impl/ under its folder's
    # name: pytest_zero3.reference_impl exists only at run time (pytest_zero3/__init__.py).  A method
    # wrapped by an untyped decorator (compiler.lazy_disable, _no_grad) is checked for presence only.
    from reference_impl.coordinator import ReferenceCoordinator

    def _reference_instance(coordinator: ReferenceCoordinator) -> Coordinator:
        return coordinator

    _reference_class: CoordinatorClass = ReferenceCoordinator
    _reference_adaptive_class: AdaptiveCoordinatorClass = ReferenceCoordinator
