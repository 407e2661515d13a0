"""Known-bad coordinator: every release also partitions the params prefetched for later modules.

A memory fix gone too far: when a module's params are released, this subclass also partitions every
gathered param that no running module claims, the ones prefetch gathered for the next modules
included.  The next fetch prefetches them again, so a pass of n modules all-gathers about n * n / 2
params' worth instead of n.  The numbers are right (every module finds its params gathered) and
every step issues the same collectives; only the volume all-gathered per step shows the refetch
storm.

Contract that must flag it: **006-a** (no step all-gathers more than twice the params); see
tests/flags.py.
"""

from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class ReleasesPrefetched(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        super().release_sub_module(module, forward)
        self._drain_inflight()
        for param in list(self._live):  # the bug: prefetched params, waiting for their module, go too
            if (
                param.ds_status == ZeroParamStatus.AVAILABLE
                and not param.ds_active_sub_modules
                and not param.ds_persist
            ):
                self._release(param)
