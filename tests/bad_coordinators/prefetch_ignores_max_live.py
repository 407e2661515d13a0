"""Known-bad coordinator: prefetch ignores ``stage3_max_live_parameters``.

The prefetch budget is the bucket alone; the live-parameter limit (DeepSpeed:
``min(max_available - n_available, bucket)``) is dropped, so with a large bucket prefetch gathers
far beyond the configured live limit.  No contract today configures the limit.

Contract that must flag it: **rule-d**; see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class PrefetchIgnoresMaxLive(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._max_live_numel = 10**18  # the bug: the configured limit is never applied
