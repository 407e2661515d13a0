"""Known-bad coordinator: the adaptive bucket samples passes whose trace is recorded or invalid (PR 8431).

The reference samples all-gather waits only while a complete, rank-agreed trace drives prefetch.
This subclass also counts every fetch of a recording or invalid pass as a sample (the first
version of PR 8431 sampled unconditionally), so the controller reaches a decision, and moves the
bucket, before or right after a re-recorded trace.  Contract **003-d** must flag it, and no other
003 contract.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class SamplesWhileRecording(ReferenceCoordinator):
    def _fetch(self, module, forward, is_leaf):
        if self.adaptive is not None and not self.is_complete_trace():  # the bug: no trace gate
            with self.adaptive.measure_wait():
                pass
            self.adaptive.fetch_done()
        return super()._fetch(module, forward, is_leaf)
