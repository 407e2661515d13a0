"""Known-bad coordinator: adaptive samples survive a trace invalidation (PR 8431).

The reference empties the controller's samples whenever the trace is invalidated or re-recorded:
waits measured under the old module order say nothing about the new one.  This subclass keeps
them; only the controller's own reset after a decision (a new interval) still empties them, so the
first decision under the new trace is made from waits of the old one.  Contract **003-d** must
flag it, and no other 003 contract.
"""

from pytest_zero3.reference_impl.adaptive import AdaptivePrefetchBucket
from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _KeepSamples(AdaptivePrefetchBucket):
    _deciding = False

    def reset(self):
        if self._deciding or not hasattr(self, "_fetches"):  # the bug: the trace's resets are ignored
            super().reset()

    def _decide(self, ratio):
        self._deciding = True
        try:
            super()._decide(ratio)
        finally:
            self._deciding = False


class KeepSamplesAcrossInvalidation(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.adaptive is not None:
            old = self.adaptive
            self.adaptive = _KeepSamples(old.size, old.min_size, old.max_size, group=old.group, interval=old.interval)
