"""Known-bad coordinator: release cache not cleared when the trace is re-recorded (PR 8883, bug 2).

Caches release decisions per coordinator, keyed by (module ds_id, step), as frozensets, and never
clears them when the trace is invalidated: after the module order changes (dynamic control flow,
MoE routing) a (module, step) seen under the old order is answered with the old order's decision.
It holds no module or coordinator (ds_ids only) and hands out frozensets, so only staleness is
reintroduced.  Contract 001-b must flag it (and only it).
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _StaleTrace:
    def __init__(self, trace, cache):
        self._trace, self._cache = trace, cache

    def __getattr__(self, name):
        return getattr(self._trace, name)

    def params_to_release(self, module, step, max_reuse_distance):
        key = (module.ds_id, step)
        if key not in self._cache:
            self._cache[key] = self._trace.params_to_release(module, step, max_reuse_distance)
        return self._cache[key]


class StaleCacheAfterRetraceCoordinator(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._release_sets = {}  # outlives every trace: this is the bug

    def reset_step(self):
        super().reset_step()
        if self._trace is not None and not isinstance(self._trace, _StaleTrace):
            self._trace = _StaleTrace(self._trace, self._release_sets)
