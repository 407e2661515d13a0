"""Known-bad coordinator: a trace invalidated while it is being recorded keeps the half-recorded pass.

``_invalidate_trace`` forgets the trace but not the modules recorded so far.  A complete trace is never
half recorded, so a divergence from one is handled as before; but DeepSpeed also invalidates when its
hooks are registered again on the root module (``deepspeed.zero.unwrap_model_for_generation`` on exit),
which a user can do in the first pass, while the trace is recorded.  The next pass then records after
the stale first half, and the trace it completes starts with a forward that never ran alone: prefetch
and the reuse window follow modules that do not come.

Contract that must flag it: **rule-g** (anchor: a read of the unwrapped model between the first
forward and its backward).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class KeepsHalfRecordedPass(ReferenceCoordinator):
    def _invalidate_trace(self) -> None:
        recorded = self._recording
        super()._invalidate_trace()
        self._recording = recorded  # the bug: the pass recorded so far survives the invalidation
