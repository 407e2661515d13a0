"""Known-bad coordinator: ``GatheredParameters`` opened between a forward and its backward finds the
backward's prefetches still in flight.

The reference's ``complete_inflight`` (which ``GatheredParameters`` calls as it opens, with the
reference installed) waits on the all-gathers in flight for the context's params.  Here it does
nothing, which is stock 0.19.8's behaviour: the context gathers only NOT_AVAILABLE params, the user
reads an INFLIGHT one empty (``torch.Size([0])`` at two ranks), and the exit's ``partition`` raises
"Cannot partition a param in flight".

Contract that must flag it: **005-f**; every other contract passes (none opens a context while a
prefetch is in flight: base-i's no-grad pass drains its gathers when the pass ends).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator


class LeavesGathersInFlight(ReferenceCoordinator):
    def complete_inflight(self, params) -> None:
        pass  # the bug: the context opens over params whose all-gathers are still in flight
