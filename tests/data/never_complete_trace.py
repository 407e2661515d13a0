"""A broken coordinator for tests/test_report.py: it never reports a complete trace.

That is a broken implementation, not a missing feature: the contracts that need a complete trace
(001-a, 001-d) must fail naming that precondition and rule-g, which judges it, never say
"unsupported".
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class NeverCompleteTrace(ReferenceCoordinator):
    def is_complete_trace(self):
        return False  # the bug: the trace is never reported complete
