"""Known-bad coordinator: every release scans the rest of the trace again.

Which of a module's params stay gathered depends on their next use within stage3_max_reuse_distance
of the trace; the reference computes that once per (module, position) for the life of the trace.
This subclass drops the cache before every release, as a fork does that removes the ``lru_cache``
from stock's ``__params_to_release`` (the leak of DeepSpeed PR 8883) without a per-trace cache in its
place: at the default reuse distance each release scans up to the param's next use, so a pass over
n modules scans about n * n / 2 modules.  Its decisions are the reference's, so every rule and parity
contract passes; only the work per pass, which grows with the square of the params' count, shows it.

Contract that must flag it: **006-b** (Python work per forward and backward linear in the params);
see tests/flags.py.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class ReleaseScanUncached(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        if self._trace is not None:
            self._trace._release_cache.clear()  # the bug: recomputed at every release
        super().release_sub_module(module, forward)
