"""Known-bad coordinator: serves each param's first gathered copy on later fetches (stale weights).

A coordinator that skips re-gathering a param it has seen before (caching the gathered tensor by
``ds_id``) computes every forward after step 0 with the weights of step 0, while the optimizer
updates the partitions.  Training still "works", losses still fall: only the parity contracts
(losses and final weights equal plain torch) show it: base-a, b, c, d, g, h and i must flag it.
"""

from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator, iter_params
from deepspeed.utils import z3_leaf_module


class StaleGatherCache(PartitionedParameterCoordinator):
    """DeepSpeed's own coordinator plus the stale copy: no other behaviour changes."""

    def fetch_sub_module(self, current_submodule, forward):
        super().fetch_sub_module(current_submodule, forward)
        first_copy = self.__dict__.setdefault("_first_copy", {})
        for p in iter_params(current_submodule, recurse=z3_leaf_module(current_submodule)):
            if p.ds_persist:
                continue
            if p.ds_id not in first_copy:
                first_copy[p.ds_id] = p.data.detach().clone()
            elif first_copy[p.ds_id].shape == p.data.shape:
                p.data.copy_(first_copy[p.ds_id])
