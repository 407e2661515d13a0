"""Known-bad coordinator: the prefetch bucket filled with per-rank shard sizes.

The prefetch loop adds ``param.partition_numel()`` (this rank's shard, as DeepSpeed's own fetch
profiler counts) instead of ``param.ds_numel`` (what the all-gather materialises), so it gathers about
world-size times ``stage3_prefetch_bucket_size`` ahead.  The bucket value itself is right (family 003
reads it), losses are unchanged, and the already-run-layer checks of 000-a do not look ahead.

Contract that must flag it: **rule-d** (applied prefetch volume); see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl.coordinator import ZeroParamStatus

from pytest_zero3 import reference_impl

reference_impl.install()


class PrefetchCountsShards(ReferenceCoordinator):
    def _prefetch(self) -> None:
        budget = min(self.prefetch_bucket_size, self._max_live_numel - self._live_numel)
        uses = self._trace.param_uses
        batch: set = set()
        numel = 0
        while self._cursor < len(uses) and numel < budget:
            param = uses[self._cursor].param
            if param.ds_status == ZeroParamStatus.NOT_AVAILABLE and param not in batch:
                batch.add(param)
                numel += param.partition_numel()  # the bug: the shard, not the gathered param
            self._cursor += 1
        self._all_gather(batch)
