"""Known-bad coordinator: the resident-param count reads every param of the model, plain ones too.

At the first fetch of a pass the reference counts the params already gathered outside it (stage 3
re-gathers the persistent ones after each optimizer step) against ``stage3_max_live_parameters``.
This is the count as the reference had it before contract 007-a: it walks every param of the root's
subtree and reads ``ds_status``, which a module attached after ``deepspeed.initialize`` does not have
(DeepSpeed never converted it), so the first forward after the attach raises ``AttributeError:
'Parameter' object has no attribute 'ds_status'`` (the failure DeepSpeed's own
``test_zero_late_module_attach.py::test_forward_after_late_submodule_attach`` showed).

Contract that must flag it: **007-a**; every contract whose model is whole at ``initialize`` passes.
"""

from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
from pytest_zero3.reference_impl import ReferenceCoordinator


class ResidentReadsPlainParams(ReferenceCoordinator):
    def _count_resident(self, root):
        for param in iter_params(root, recurse=True):  # the bug: plain params have no ds_status
            if param.ds_status != ZeroParamStatus.NOT_AVAILABLE and param not in self._live:
                self._live[param] = None
                self._live_numel += param.ds_numel
