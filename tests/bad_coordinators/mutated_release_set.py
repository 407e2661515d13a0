"""Known-bad coordinator: backward adds recompute params into the cached release set (PR 8883, bug 3).

deepspeed 0.19.8 does ``params_to_release.update(recompute_params)`` on the set its cache returned.
Through 0.19.8's own keys that mutation has not been seen to change behaviour (see contract 001-c's
docstring): no later call that could release reads a mutated set.  This coordinator makes the same
in-place update reachable: its per-trace cache hands out mutable sets and shares one set object
between keys whose decisions are equal (interning, a common memory saving), so the backward
release of a module mutates the set its forward release reads on the next step.  Cleared with the
trace and keyed by ds_id, so only the mutation is reintroduced.  Contract 001-c must flag it (its
reuse-one-layer case) and nothing else.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class _MutableSetTrace:
    def __init__(self, trace):
        self._trace, self._by_key, self._interned = trace, {}, {}

    def __getattr__(self, name):
        return getattr(self._trace, name)

    def params_to_release(self, module, step, max_reuse_distance):
        key = (module.ds_id, step)
        if key not in self._by_key:
            decision = self._trace.params_to_release(module, step, max_reuse_distance)
            self._by_key[key] = self._interned.setdefault((module.ds_id, decision), set(decision))
        return self._by_key[key]


class MutatedReleaseSetCoordinator(ReferenceCoordinator):
    def reset_step(self):
        super().reset_step()
        if self._trace is not None and not isinstance(self._trace, _MutableSetTrace):
            self._trace = _MutableSetTrace(self._trace)

    def release_sub_module(self, module, forward=False):
        if not forward and self.is_complete_trace() and module.ds_recompute_parameters:
            cached = self._trace.params_to_release(module, self._step, self._max_reuse_distance)
            cached.update(p.ds_id for p in module.ds_recompute_parameters if not p.ds_persist)  # the bug
        super().release_sub_module(module, forward)
