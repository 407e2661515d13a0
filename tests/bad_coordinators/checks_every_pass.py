"""Known-bad coordinator: the cross-rank order check runs at every step over every pass so far.

The reference checks once, when a recorded pass becomes the trace, that every rank ran the same
module order (a collective).  This subclass keeps each pass's order for a debug message and checks
the whole list again at every step, one collective per pass kept: step k issues k more collectives
than step 1.  Fetches, releases and numbers are the reference's, so every other contract passes;
only the count of collectives per step shows it.

Contract that must flag it: **006-a** (the same collectives at every step once the trace is
complete); see tests/flags.py.
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator
from pytest_zero3.reference_impl.trace import Trace


class ChecksEveryPass(ReferenceCoordinator):
    def reset_step(self):
        super().reset_step()
        if self.is_complete_trace():
            passes = self.__dict__.setdefault("_passes", [])
            passes.append(self._trace.modules)
            for modules in passes:  # the bug: the history is never trimmed, and re-checked every step
                Trace.check_same_on_all_ranks(modules)
