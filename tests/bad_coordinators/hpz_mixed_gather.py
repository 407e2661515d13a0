"""Known-bad coordinator: params with and without an hpZ secondary shard all-gathered in one call.

With ``zero_hpz_partition_size`` each param gets a secondary shard (a partition within the node)
when it is released after forward; backward gathers from it.  The optimizer step invalidates the
secondary shards of trainable params only, so at the next forward a frozen param still has one and
a trainable param has none.  ``all_gather_coalesced`` picks the source for the whole call from its
first param: a coordinator that gathers both kinds together reads a secondary shard that does not
exist (or the primary where the secondary is meant).  DeepSpeed's coordinator and the reference split
every gather by kind; this is the reference without the split.

Without hpZ no param has a secondary shard, so the fp32 profile cannot see it.  Contract that must
flag it under ``--zero3-profile=hpz``: **base-f** (its checkpointed model with a frozen layer, prefetch
on, gathers the frozen layer together with trainable ones).
"""

from contextlib import nullcontext

from deepspeed.accelerator import get_accelerator
from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl.coordinator import _NOT_AVAILABLE, _ds_id, _on_nvme

from pytest_zero3 import reference_impl

reference_impl.install()


class HpzMixedGather(ReferenceCoordinator):
    def _all_gather(self, params):
        pending = sorted((p for p in params if p.ds_status == _NOT_AVAILABLE), key=_ds_id)
        if not pending:
            return
        stream = self._allgather_stream
        with get_accelerator().stream(stream) if stream is not None else nullcontext():
            handle = pending[0].all_gather_coalesced(pending, quantize=self.zero_quantized_weights)  # the bug
        for param in pending:
            self._registry[param] = handle
            if param not in self._live:
                self._live[param] = None
                self._live_numel += param.ds_numel
        persisted_on_nvme = [p for p in pending if p.ds_persist and _on_nvme(p)]
        if persisted_on_nvme:
            persisted_on_nvme[0].nvme_swapper.remove_partition_and_release_buffers(persisted_on_nvme)
