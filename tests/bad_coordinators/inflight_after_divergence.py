"""Known-bad coordinator: "still have inflight params" after a pass that diverged from the trace.

An invalidation forgets the trace but not the all-gathers its prefetch issued: a param prefetched for
the recorded branch (the expert the router picked when the trace was recorded) stays in flight when
the pass takes another branch, and the next pass's start finds it there and raises, as DeepSpeed's
``reset_step`` did before ``_invalidate_trace`` learned to drain the registry.

Contract that must flag it: **rule-a** (the next step raised; anchor: top-1 routing, prefetch on).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class InflightAfterDivergence(ReferenceCoordinator):
    def _invalidate_trace(self) -> None:
        self._mode = "invalid"
        self._trace = None
        self._recording = []
        self._cursor = 0
        self._nvme_keep_until.clear()
        # the bug: the registry of in-flight prefetches is not drained

    def reset_step(self) -> None:
        if self._registry:
            raise RuntimeError(f"still have inflight params {[p.ds_id for p in self._registry]}")
        super().reset_step()
