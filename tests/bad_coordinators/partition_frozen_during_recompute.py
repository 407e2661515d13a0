"""Known-bad coordinator: partitions frozen params during an activation-checkpoint recompute.

Puts DeepSpeed's pre-0.19.3 bug (PR 8130, fixed by PR 8148) back into the reference coordinator,
and nothing else: when a forward post-hook fires inside backward (a non-reentrant checkpoint
recompute), a frozen param of the module loses the claim of the backward module it was attributed
to, so the forward release partitions it in place (shape [0]) while checkpoint still holds it
undetached.  Backward then dies with ``CheckpointError`` ("saved [16], recomputed [0]"), as on
deepspeed 0.19.2.  Built on the reference (not on stock 0.19.8) so that no other contract family
has a reason to fail.

Must be flagged by contract **002-a**, and by nothing outside family 002.
"""

import torch
from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
from deepspeed.utils import z3_leaf_module
from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class PartitionFrozenDuringRecompute(ReferenceCoordinator):
    @torch.no_grad()
    def release_sub_module(self, module, forward=False):
        if forward and torch._C._current_graph_task_id() != -1:
            for param in iter_params(module, recurse=z3_leaf_module(module)):
                if not param.requires_grad:
                    # the bug: drop the recompute owner's claim, as deepspeed <= 0.19.2 never made one
                    param.ds_active_sub_modules.clear()
        super().release_sub_module(module, forward=forward)
