"""Known-bad coordinator: the backward reuse scan stops one module late at an exact boundary.

DeepSpeed scans a module only while fewer than ``stage3_max_reuse_distance`` elements were scanned
before it (``if scanned >= distance: break``).  This coordinator's backward releases compare with
``>`` instead, so when the scanned numel lands exactly on the distance, one more module is scanned
and its params are kept (for integers, ``scanned > d`` is ``scanned >= d + 1``: the reference with
the distance raised by one in backward).  Families 000's window checks judge forward releases at
distances that are not boundaries of the backward part of the trace.

Contract that must flag it: **rule-c** / **rule-b** at an exact boundary (a tied weight reused by the
first module past the window); see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class BackwardWindowOffByOne(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        if forward:
            return super().release_sub_module(module, forward)
        self._max_reuse_distance += 1  # the bug: `>` for `>=` in the backward scan
        try:
            super().release_sub_module(module, forward)
        finally:
            self._max_reuse_distance -= 1
