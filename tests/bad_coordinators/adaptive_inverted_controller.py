"""Known-bad coordinator: the adaptive controller reads its wait ratio backwards (PR 8431).

Everything of the reference is kept (rank agreement, trace gating, clamping) except the sense of
the group's wait ratio: long all-gather waits read as none, and no waits as long ones, so the
bucket shrinks when prefetch is too short and grows when it is not needed.  Ranks still agree and
numerics are untouched.  Contract **003-f** (the controller adapts in the right direction) must
flag it, and no other 003 contract.
"""

from pytest_zero3.reference_impl.adaptive import AdaptivePrefetchBucket
from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _InvertedBucket(AdaptivePrefetchBucket):
    def _group_max(self, ratio: float) -> float:
        return 0.0 if super()._group_max(ratio) > 0.1 else 1.0  # the bug: waits and no waits swapped


class InvertedController(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.adaptive is not None:
            old = self.adaptive
            self.adaptive = _InvertedBucket(
                old.size, old.min_size, old.max_size, group=old.group, interval=old.interval
            )
