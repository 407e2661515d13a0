"""Known-bad coordinator: ``log_trace_cache_warnings`` ignored, every trace invalidation warned.

The coordinator receives the key (``DeepSpeedZeRoOffload`` passes it) and never reads it: each
invalidation is a WARNING whatever the user configured.  A model with data-dependent branches, an
eval loop or a generation loop invalidates the trace every pass, so the logs fill with trace-cache
warnings (five upstream issues asked for the key because of that).  Training is unchanged.

Contract that must flag it: **base-k**.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class TraceWarningsAlways(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._log_trace_warnings = True  # the bug: the configured value is dropped
