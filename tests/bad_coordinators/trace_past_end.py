"""Known-bad coordinator: a pass longer than the recorded trace indexes past its end.

``trace_prologue`` compares the fetched module with ``trace.modules[step]`` without checking that the
trace has a step there.  A trace recorded by a shorter pass (an evaluation forward before the first
training step, a short generation) is complete; the next, longer pass (a training step with its
backward) reaches the end of the trace and raises ``IndexError`` instead of invalidating it.

Contract that must flag it: **rule-a** (the step raised; anchor: eval pass at step 0).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class TracePastEnd(ReferenceCoordinator):
    def trace_prologue(self, module) -> None:
        if self._mode == "complete" and self._trace.modules[self._step] is not module:  # the bug: no bound
            super().trace_prologue(module)  # a mismatch within the trace: logged and invalidated as before
