"""Known-bad coordinator: the live-parameter count is zeroed at the start of every pass.

DeepSpeed 0.19.8's ``reset_step`` sets ``__n_available_params = 0`` while params can still be
gathered: those an eval forward kept for a reuse that never came (and, before 0.19.3, those kept at
the end of backward).  Releasing them later subtracts their numel again, the count goes negative and
the prefetch budget ``max_live - count`` exceeds ``stage3_max_live_parameters``.  This is the
reference with that one line put back (its count keeps the params still gathered).

Contract that must flag it: **rule-d** (its anchor with an eval forward under a live limit).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class LiveCountReset(ReferenceCoordinator):
    def reset_step(self):
        super().reset_step()
        self._live_numel = 0  # the bug: kept params are still in self._live and will be subtracted
