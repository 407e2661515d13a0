"""Known-bad coordinator: params already gathered or in flight charged against the prefetch bucket.

The prefetch loop skips a param that is not NOT_AVAILABLE (nothing to gather) but still adds its numel
to the batch's, so a bucket whose next uses are partly resident (a reuse window, a module called
twice, the backward right after the forward) fills with params it never gathers and stops early.
Silent: the loss of overlap changes no number and no release.

Contract that must flag it: **rule-d** (exact prefetch: gathered params are skipped without charge).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl.coordinator import ZeroParamStatus

from pytest_zero3 import reference_impl

reference_impl.install()


class PrefetchChargesGathered(ReferenceCoordinator):
    def _prefetch(self) -> None:
        budget = min(self.prefetch_bucket_size, self._max_live_numel - self._live_numel)
        uses = self._trace.param_uses
        batch: dict = {}
        numel = 0
        while self._cursor < len(uses) and numel < budget:
            param = uses[self._cursor].param
            if param not in batch:
                if param.ds_status == ZeroParamStatus.NOT_AVAILABLE:
                    batch[param] = None
                numel += param.ds_numel  # the bug: charged whether or not it is gathered here
            self._cursor += 1
        if batch:
            self._all_gather(batch)
