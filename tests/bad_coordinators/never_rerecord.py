"""Known-bad coordinator: never records a trace again once a complete one was invalidated.

The reference re-records after a change of module order (dynamic control flow, MoE routing): the
pass after the invalidation records, the next one prefetches along the new order.  This subclass
gives up instead: after its first complete trace is invalidated it stays in "invalid" mode for
good, so it fetches on demand and releases at once (numerics and release stay correct) but never
prefetches again.  Contract **base-g** (prefetch follows the re-recorded order) must flag it, and
no other baseline contract.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class NeverRerecord(ReferenceCoordinator):
    _had_complete = False

    def reset_step(self):
        gave_up = self._had_complete and self.is_invalid_trace()
        super().reset_step()
        self._had_complete = self._had_complete or self.is_complete_trace()
        if gave_up:
            self._mode = "invalid"  # the bug: the pass that should record a new trace does not
