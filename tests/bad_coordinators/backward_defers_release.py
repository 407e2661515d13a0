"""Known-bad coordinator: backward releases deferred to the end-of-backward sweep.

A plausible "optimisation": ``release_backward_leftovers`` partitions whatever is still claimed when
backward ends, so the per-module post-backward release is skipped once the trace is complete.  Every
param gathered in backward then stays until the end of backward: peak memory in backward is the
whole model, as if ZeRO-3 were off.  Every contract that reads residency in forward, after
``backward()`` or after ``step()`` sees nothing wrong.

Contract that must flag it: **rule-b** (the module's params must be partitioned when its backward
hook ends); see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class BackwardDefersRelease(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        if not forward and self.is_complete_trace():
            return  # the bug: left to release_backward_leftovers (the module stays in the backward set)
        super().release_sub_module(module, forward)
