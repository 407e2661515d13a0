"""Known-bad coordinator: a module's fetch and release leave out its plain torch params.

A param set on a hooked module after ``deepspeed.initialize`` (transformers' ``resize_token_embeddings``
under ZeRO-3, an assigned ``nn.Parameter``) has none of ZeRO-3's attributes, and stock 0.19.8 crashes
on the first one it reads (``'Parameter' object has no attribute 'ds_id'``).  The obvious fix is to read
only ZeRO-3 params, as the reference does below a z3 leaf for a module attached after ``initialize``
(007-a): the crash goes, and the replaced param runs as a plain tensor that no optimizer holds.  For an
assigned ``nn.Parameter`` that is what plain torch does with the optimizer built before; for a resized
embedding it is not: plain torch resizes the same Parameter in place, its optimizer trains every row, and
here the embedding never moves again.  The reference's check of a complete trace still sees the module's
params change and refuses, so only a change made before the trace is complete trains in silence.

This file makes the reference's param sets (``module_params``, ``module_param_set``; the trace's too)
leave out plain params in every process that imports it: the coordinator is the reference's.

Contract that must flag it: **007-d**; every contract whose model is whole at ``initialize`` passes.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl import coordinator as ref_coordinator
from pytest_zero3.reference_impl import trace as ref_trace

_module_params = ref_trace.module_params
_module_param_set = ref_trace.module_param_set


def _zero_only_params(module):
    return [p for p in _module_params(module) if hasattr(p, "ds_id")]  # the bug: a replaced param is left plain


def _zero_only_param_set(module, is_leaf):
    return {p for p in _module_param_set(module, is_leaf) if hasattr(p, "ds_id")}


ref_trace.module_params = ref_coordinator.module_params = _zero_only_params
ref_coordinator.module_param_set = _zero_only_param_set


class HidesPlainParams(ReferenceCoordinator):
    pass
