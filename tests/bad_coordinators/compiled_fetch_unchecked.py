"""Known-bad coordinator: the fetch trusts the trace that a compiled backward never checked.

In a backward compiled by compiled autograd, stage 3's pre-backward hook runs inside code dynamo
traced: the coordinator's ``trace_prologue`` and ``record_module`` are no-ops there, while its
``fetch_sub_module`` runs eagerly (a graph break).  The recorded trace then holds fewer backward modules
than the pass fetches, and nothing compares the fetched module with the trace before the fetch indexes
it: a two-module model (``ShallowNet``, a trace of its forward's 3 modules) fetches past the end in its
first compiled backward, ``IndexError``.  The reference checks again in the fetch; this is the reference
with that check left to ``trace_prologue`` alone.

Under fp32 008-m compiles with dynamo disabled (the hooks run eagerly, ``trace_prologue`` checks), so
only the compile profile can see it.  Contract that must flag it: **008-m** under
``--zero3-profile=compile``.
"""

from deepspeed.runtime.compiler import is_compiling
from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class CompiledFetchUnchecked(ReferenceCoordinator):
    def trace_prologue(self, module) -> None:
        if is_compiling():
            return
        ReferenceCoordinator._check_trace(self, module)

    def _check_trace(self, module) -> None:  # the bug: the fetch no longer checks, trace_prologue alone does
        pass
