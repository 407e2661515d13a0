"""``engine.compile()`` trains with the reference coordinator exactly as with stock deepspeed.

Stock excludes its coordinator's entry points from torch.compile (``compiler.disable`` on the hook
paths, ``is_compiling()`` early returns); without that, dynamo traces into the coordinator from the
module hooks it does not itself disable (the post-forward release) and bakes parameter state into
guards.  The same model, data and compiled engine, once with stock's coordinator and once with the
reference, must give bitwise the same losses, and dynamo must never be tracing when the reference's
fetch or release runs (``torch.compiler.is_compiling()`` observed inside them), nor compile a frame
of DeepSpeed's module hooks, which hold no graph (stock's post-forward and pre-backward hooks are
traced once per module, up to dynamo's recompile limit).

The ``eager`` backend keeps dynamo's tracing (what the guards are about) without inductor's C++
build.  Cost: one 1-rank world, two compiled engines of 3 steps: dynamo tracing dominates, about 30 s on the
2-core CI machine (measured 145 s with 2 ranks on a machine at load 20).
"""

import pytest
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.config import MICRO_BATCH, zero3_config
from pytest_zero3.fixtures.models import MLP, WIDTH

from pytest_zero3 import scenario

STEPS = 3


def traced_under_compile() -> list:
    """Patch the reference's inner fetch and release to note whether dynamo is tracing them."""
    import torch
    from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator

    seen = []
    for name in ("_fetch", "_release"):
        original = getattr(ReferenceCoordinator, name)

        def probe(self, *args, _original=original, _name=name, **kwargs):
            if torch.compiler.is_compiling():
                seen.append(_name)
            return _original(self, *args, **kwargs)

        setattr(ReferenceCoordinator, name, probe)
    return seen


#: DeepSpeed's module hooks (``DeepSpeedZeRoOffload._register_deepspeed_module``) that hold no graph
MODULE_HOOKS = (
    "_pre_forward_module_hook",
    "_post_forward_module_hook",
    "_pre_backward_module_hook",
    "_post_backward_module_hook",
)


def hook_entries() -> dict:
    """How many frames dynamo compiled of each of DeepSpeed's module hooks, since its last reset."""
    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = [ref() for ref in convert_frame.input_codes.seen]
    return {
        name: sum(len(_debug_get_cache_entry_list(c)) for c in codes if c is not None and c.co_name == name)
        for name in MODULE_HOOKS
    }


def compiled_losses() -> dict:
    import torch

    from pytest_zero3 import reference_impl

    traced = traced_under_compile()
    out = {}
    for impl in ("stock", "reference"):
        if impl == "reference":
            reference_impl.install()
        else:
            reference_impl.uninstall()
        torch._dynamo.reset()
        engine = eng.build(
            lambda: MLP(2), zero3_config(scenario.world_size(), zero={"stage3_prefetch_bucket_size": 300})
        )
        engine.compile(backend="eager")
        assert engine.is_compiled
        coordinator = type(eng.coordinator(engine)).__name__
        losses = []
        for step in range(STEPS):
            x, _ = eng.batch(step, (MICRO_BATCH, WIDTH), scenario.rank(), scenario.world_size())
            losses.append(eng.train_step(engine, x))
        engine.destroy()
        out[impl] = dict(losses=losses, coordinator=coordinator, hooks_traced=hook_entries())
    out["traced"] = sorted(set(traced))
    return out


@pytest.mark.zero3_world_size(1)
@pytest.mark.zero3_timeout(300)
def test_compiled_engine_trains_as_with_stock(zero3_world):
    """Why: a coordinator that dynamo traces into breaks ``engine.compile()`` users (issue 14)."""
    for rank, res in enumerate(zero3_world.run(compiled_losses)):
        assert res["reference"]["coordinator"] == "ReferenceCoordinator", res
        assert res["stock"]["coordinator"] == "PartitionedParameterCoordinator", res
        assert not res["traced"], (
            f"rank {rank}: torch.compile traced into the reference coordinator's "
            f"{res['traced']}: its entry points must be excluded from compilation"
        )
        # stock traces its post-forward and pre-backward hooks, once per module until dynamo's recompile
        # limit; the reference runs every module hook eagerly (reference_impl/install.py)
        assert res["stock"]["hooks_traced"]["_post_forward_module_hook"] > 1, res["stock"]
        assert not any(res["reference"]["hooks_traced"].values()), res["reference"]
        assert res["reference"]["losses"] == res["stock"]["losses"], (
            f"rank {rank}: compiled losses differ:\n  stock     {res['stock']['losses']}\n"
            f"  reference {res['reference']['losses']}"
        )
