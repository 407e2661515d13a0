"""Known-bad coordinator: releases every param when its module ends, ignoring stage3_max_reuse_distance.

An over-eager reading of DeepSpeed PR 9003: the reference coordinator with the reuse window forced
to 0, so nothing is kept for a reuse, not even at the default distance (1e9), whose behaviour the
PR leaves unchanged (params stay resident from forward through backward).  Family 000 must flag it
on the contracts that configure a non-zero distance (measured, see tests/flags.py) and
pass the distance-0 ones (000-a, 000-c), where forcing 0 changes nothing.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class IgnoresReuseDistance(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._max_reuse_distance = 0  # the bug: the configured window is dropped
