"""Known-bad coordinator: adaptive prefetch bucket decided from each rank's own clock (PR 8431 review).

The first version of DeepSpeed PR 8431 resized the bucket from each rank's unsynchronised wall-clock
measurements.  Timing differs between ranks (one is slower, or just noisy), so ranks pick different
sizes, prefetch different parameters and issue mismatched all-gathers: the job hangs or fails.

This subclass of the reference coordinator keeps everything else (trace-gated sampling, clamped
start, injectable clock) and drops only the all-reduce of the wait ratio: each rank decides from its
own ratio.  Contract 003-b must flag it, without hanging the run, and no other 003 contract.
"""

from pytest_zero3.reference_impl.adaptive import AdaptivePrefetchBucket
from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _RankLocalBucket(AdaptivePrefetchBucket):
    def _group_max(self, ratio: float) -> float:
        return ratio  # the bug: no reduction over the data-parallel group


class RankLocalAdaptiveCoordinator(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.adaptive is not None:
            shared = self.adaptive
            self.adaptive = _RankLocalBucket(
                shared.size, shared.min_size, shared.max_size, group=shared.group, interval=shared.interval
            )
