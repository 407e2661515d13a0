"""The reference's live-parameter accounting stays exact when parameters are gathered and
partitioned outside the coordinator (``deepspeed.zero.GatheredParameters`` inside a step).

``stage3_max_live_parameters`` caps what prefetch may gather on top of what is live.  A coordinator
that counts a parameter again when it gathers it after someone else partitioned it (and forgets it
only once) sees its budget shrink step after step: prefetch fetches less and less, for the rest of
the run.  Here ``GatheredParameters`` over the whole model runs between each forward and backward:
it partitions on exit the params the forward kept for backward (default reuse distance), and
backward gathers them again.  The observable is what is gathered (or in flight) at every module's
forward pre-hook, after DeepSpeed's fetch and prefetch: it must be the same on every step.

Cost: one 1-rank world, 100 steps of a 6-layer 16-wide MLP, about 15 s on the 2-core CI machine.
"""

import pytest
import torch
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.config import MICRO_BATCH, zero3_config
from pytest_zero3.fixtures.models import MLP, WIDTH

from pytest_zero3 import scenario

LAYER = WIDTH * WIDTH + WIDTH
STEPS = 100


def gathered_volume_per_step(install: bool) -> list:
    """Per step, the gathered-or-in-flight numel at each module's forward pre-hook; between forward
    and backward every parameter is gathered and partitioned again by ``GatheredParameters``."""
    import deepspeed

    from pytest_zero3 import reference_impl

    if install:
        reference_impl.install()
    config = zero3_config(
        scenario.world_size(), zero={"stage3_prefetch_bucket_size": 2 * LAYER, "stage3_max_live_parameters": 8 * LAYER}
    )
    engine = eng.build(lambda: MLP(6), config)
    params = list(engine.module.parameters())
    seen = []

    def probe(module, args):
        if torch._C._current_graph_task_id() == -1:
            seen[-1].append(sum(p.ds_numel for p in params if p.ds_status.name != "NOT_AVAILABLE"))

    for module in engine.module.modules():
        module.register_forward_pre_hook(probe)
    for step in range(STEPS):
        seen.append([])
        x, _ = eng.batch(step, (MICRO_BATCH, WIDTH), scenario.rank(), scenario.world_size())
        loss = engine(x).float().pow(2).mean()
        with deepspeed.zero.GatheredParameters(params):
            pass
        engine.backward(loss)
        engine.step()
    engine.destroy()
    return seen


@pytest.mark.zero3_world_size(1)
def test_outside_gathers_keep_prefetch_volume_constant(zero3_world):
    """Why: a drifting count shrinks the prefetch budget for the rest of the run (issue 14)."""
    for rank, seen in enumerate(zero3_world.run(gathered_volume_per_step, True)):
        steady = seen[1]  # step 0 records the trace, prefetch follows it from step 1
        assert max(steady) > LAYER, f"rank {rank}: prefetch never ran, the case proves nothing: {steady}"
        drift = [(step, volumes) for step, volumes in enumerate(seen[1:], start=1) if volumes != steady]
        assert not drift, (
            f"rank {rank}: gathered numel at the forward pre-hooks changed after outside "
            f"gathers; step 1 {steady}, then (step, volumes) {drift[:3]}"
        )
