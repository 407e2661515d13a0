"""The coordinator protocol: what DeepSpeed's ZeRO-3 engine calls on a parameter coordinator.

Read off deepspeed 0.19.8 (``runtime/zero/parameter_offload.py`` constructs the coordinator and its
module hooks drive it; ``stage3.py`` calls ``release_backward_leftovers`` at the end of backward and
sets ``hierarchy`` in ``step``).  A class given as ``--zero3-impl=module:Class`` is checked against
this list before any world starts.

Constructor keywords (all passed by name)::

    prefetch_bucket_sz, max_reuse_distance_in_numel, max_available_parameters_in_numel,
    allgather_stream (None on CPU), inflight_param_registry, prefetch_nvme, timers,
    zero_quantized_weights, zero_quantized_nontrainable_weights,
    fast_sharding_for_leaf_module, log_trace_cache_warnings

Implementations of the adaptive prefetch bucket (contract family 003) also accept
``adaptive_prefetch, adaptive_prefetch_min_sz, adaptive_prefetch_max_sz, dp_process_group``:
under ``--zero3-impl=module:Class`` any class whose constructor names all four (or takes
``**kwargs``) gets them from the ``stage3_adaptive_prefetch_*`` config keys; any other class is
built with the keywords above only (a rank-0 warning says so when adaptation is on).

Not DeepSpeed's: with the reference's fixes installed, ``GatheredParameters`` calls
``complete_inflight(params)`` on a coordinator that defines it, as the context opens, to complete the
all-gathers it has in flight for those params (contract 005-f).
"""

#: Methods DeepSpeed's hooks and optimizer call, with what each call means.
REQUIRED_METHODS = {
    "reset_step": "end of a forward/backward iteration: drain prefetches, finish recording the trace",
    "trace_prologue": "before a module runs: check it against the recorded trace",
    "is_record_trace": "whether the trace is being recorded this iteration",
    "is_complete_trace": "whether a complete trace exists (prefetch may follow it)",
    "is_invalid_trace": "whether no usable trace exists",
    "_invalidate_trace": "drop the trace and everything derived from it",
    "record_module": "append a module to the trace being recorded",
    "fetch_sub_module": "(module, forward): make the module's params available",
    "release_sub_module": "(module, forward): release what is not reused within the reuse distance",
    "release_and_reset_all": "(module): partition every param of the module tree",
}

#: Called only by DeepSpeed releases that carry the activation-checkpoint fix (0.19.3 and later).
OPTIONAL_METHODS = {
    "release_backward_leftovers": "end of backward: release params gathered for checkpoint recompute",
}

#: Attributes DeepSpeed writes.
WRITABLE_ATTRIBUTES = ("hierarchy",)


def missing_methods(cls) -> list:
    """Names from :data:`REQUIRED_METHODS` that ``cls`` does not define as callables."""
    return [name for name in REQUIRED_METHODS if not callable(getattr(cls, name, None))]
