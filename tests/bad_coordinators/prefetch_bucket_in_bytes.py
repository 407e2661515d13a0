"""Known-bad coordinator: the prefetch bucket budgeted in bytes, at 4 bytes per element.

A coordinator that sizes its prefetch by memory converts ``stage3_prefetch_bucket_size`` (and the
``stage3_max_live_parameters`` headroom) from elements to bytes at fp32's 4 bytes per element and
charges each prefetched param its gathered bytes (``ds_numel * element_size()``).  At fp32 the two
conversions cancel and the batch is exactly DeepSpeed's; at bf16 (2 bytes per element) each param is
charged half its elements, so prefetch gathers about twice the bucket ahead (and twice the live
headroom).  Losses are unchanged: only what is gathered early moves.

Contract that must flag it: **rule-d**, on its anchor with the ``bf16`` axis (a one-layer bucket:
two layers prefetched).  No fp32 run can: every hand-written contract runs at fp32 here, and so does
every rule anchor but that one, where the budget is exact.  See tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl.coordinator import ZeroParamStatus

from pytest_zero3 import reference_impl

reference_impl.install()

FP32_BYTES = 4


class PrefetchBucketInBytes(ReferenceCoordinator):
    def _prefetch(self) -> None:
        budget = FP32_BYTES * min(self.prefetch_bucket_size, self._max_live_numel - self._live_numel)
        uses = self._trace.param_uses
        batch: set = set()
        nbytes = 0
        while self._cursor < len(uses) and nbytes < budget:
            param = uses[self._cursor].param
            if param.ds_status == ZeroParamStatus.NOT_AVAILABLE and param not in batch:
                batch.add(param)
                nbytes += param.ds_numel * param.element_size()  # the bug: bf16 params cost half the bucket
            self._cursor += 1
        self._all_gather(batch)
