"""Known-bad coordinator: release decisions cached at class level (DeepSpeed PR 8883, bug 1).

Reintroduces deepspeed 0.19.8's ``@functools.lru_cache`` on ``__params_to_release`` as far as lifetime
goes: one dictionary on the class, keyed by (coordinator, module, step), holding strong references
to every coordinator and module that ever released a parameter on a complete trace.  Its entries
for a coordinator are dropped when that coordinator's trace is invalidated and it hands out
frozensets, so only the leak is reintroduced.  Contract 001-a must flag it (and only it).
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _CachedTrace:
    """The reference's trace, with ``params_to_release`` answered from the class-level cache."""

    def __init__(self, trace, owner):
        self._trace, self._owner = trace, owner

    def __getattr__(self, name):
        return getattr(self._trace, name)

    def params_to_release(self, module, step, max_reuse_distance):
        key = (self._owner, module, step)  # strong references: this is the bug
        cache = type(self._owner).release_cache
        if key not in cache:
            cache[key] = self._trace.params_to_release(module, step, max_reuse_distance)
        return cache[key]


class ClassLevelCacheCoordinator(ReferenceCoordinator):
    release_cache = {}  # shared by every instance, never emptied by destroy()

    def reset_step(self):
        super().reset_step()
        if self._trace is not None and not isinstance(self._trace, _CachedTrace):
            self._trace = _CachedTrace(self._trace, self)

    def _invalidate_trace(self):
        for key in [k for k in self.release_cache if k[0] is self]:
            del self.release_cache[key]
        super()._invalidate_trace()
