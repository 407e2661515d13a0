"""Known-bad coordinator: never empties ``module.ds_recompute_parameters`` (the recompute attribution).

During a non-reentrant checkpoint recompute the reference attributes each frozen param to the
module whose backward triggered it (``ds_recompute_parameters``), releases it with that module's
backward release, and empties the set there (and in ``release_backward_leftovers`` and
``release_and_reset_all``, the safety nets).  This subclass keeps the attribution instead (as if
it were a cache: the same frozen params are recomputed every step), in all three places.  The
params are still released and partitioned, so numerics and residency are untouched; only the
bookkeeping is left behind after ``engine.step()``.

Why all three places: measured on every baseline scenario, the reference's ``release_and_reset_all``
finds nothing left to clean (no gathered non-persistent param, no claim, no attribution, no
unfinished backward module), so a bug confined to ``release_and_reset_all`` or
``release_backward_leftovers`` cannot show after a step, and one confined to the backward release is
erased by the safety net.  Contract **base-f** must flag it, and no other baseline contract (only
its checkpointed model recomputes frozen params).
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


def _attributions(modules):
    return [(m, set(m.ds_recompute_parameters)) for m in modules if getattr(m, "ds_recompute_parameters", None)]


def _restore(kept):
    for module, params in kept:
        module.ds_recompute_parameters |= params  # the bug: the attribution outlives its release


class KeepsRecomputeAttribution(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        kept = _attributions([module])
        super().release_sub_module(module, forward=forward)
        _restore(kept)

    def release_backward_leftovers(self):
        kept = _attributions(list(self._active_backward.values()))
        super().release_backward_leftovers()
        _restore(kept)

    def release_and_reset_all(self, module):
        kept = _attributions(module.modules())
        super().release_and_reset_all(module)
        _restore(kept)
