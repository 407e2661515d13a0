"""Known-bad coordinator: the adaptive bucket starts at stage3_prefetch_bucket_size unclamped (PR 8431).

The reference clamps the starting size into ``[stage3_adaptive_prefetch_min_sz, ..._max_sz]``.
This subclass overwrites it with the raw ``stage3_prefetch_bucket_size``, so a start outside the
bounds is applied at the first fetches, until the first decision clamps it.  Contract **003-c**
must flag it, and no other 003 contract.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class UnclampedStart(ReferenceCoordinator):
    def __init__(self, prefetch_bucket_sz, *args, **kwargs):
        super().__init__(prefetch_bucket_sz, *args, **kwargs)
        if self.adaptive is not None:
            self.adaptive._size = int(prefetch_bucket_sz)  # the bug: no clamp into [min, max]
