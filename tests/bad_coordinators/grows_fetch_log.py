"""Known-bad coordinator: a fetch log that is never trimmed.

Each fetch appends ``(step, module id)`` to a list kept for debugging, and nothing ever clears it.
Tuples of ints are not tracked by the garbage collector once collected, so a census of gc-tracked
objects sees one list whatever its length: only the memory retained by the coordinator's own
allocations shows the growth (about 60 bytes per fetch, for the whole run).

Contract that must flag it: **001-d** with its retained-memory bound (tracemalloc over the
coordinator's calls); see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class GrowsFetchLog(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fetch_log = []

    def fetch_sub_module(self, module, forward):
        self._fetch_log.append((self._step, module.ds_id))  # the bug: never trimmed
        super().fetch_sub_module(module, forward)
