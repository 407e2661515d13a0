"""The reference refuses ``copy.deepcopy`` of a module an engine hooks, even where every param is gathered.

With every param persistent (gathered between steps) torch's copy of ``engine.module`` holds the
weights, but it carries the engine's hooks: its forward begins a step of the engine's coordinator and
raises on the copy's plain params, after which the engine's trace is lost (seq-a, seed 20261206).  The
reference refuses such a copy at the call, the model's and a submodule's alike, inside
``GatheredParameters`` too, and leaves the engine as it was; ``destroy()`` takes the refusal off with
the hooks.

Cost: one 1-rank world, 3 steps of a 3-layer MLP, about 5 s on the 2-core CI machine.
"""

import pytest
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.config import MICRO_BATCH, zero3_config
from pytest_zero3.fixtures.models import MLP, WIDTH

from pytest_zero3 import scenario


def copies_of_a_persistent_model() -> dict:
    import copy

    import deepspeed

    from pytest_zero3 import reference_impl

    reference_impl.install()
    config = zero3_config(scenario.world_size(), zero={"stage3_param_persistence_threshold": WIDTH * WIDTH})
    engine = eng.build(lambda: MLP(3), config)
    out = {}
    for step in range(2):
        eng.train_step(engine, eng.batch(step, (MICRO_BATCH, WIDTH), 0, 1)[0])
    out["gathered"] = all(p.ds_status.name == "AVAILABLE" for p in engine.module.parameters())

    def refusal(what, gathered=False):
        try:
            with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=gathered):
                copy.deepcopy(what)
        except RuntimeError as exc:
            return str(exc)
        return "copied"

    out["model"] = refusal(engine.module)
    out["submodule"] = refusal(engine.module[2])
    out["inside GatheredParameters"] = refusal(engine.module, gathered=True)
    eng.train_step(engine, eng.batch(2, (MICRO_BATCH, WIDTH), 0, 1)[0])
    out["complete trace after"] = eng.coordinator(engine).is_complete_trace()
    engine.destroy()
    copied = copy.deepcopy(engine.module)  # no hooks left, every param gathered: torch's copy
    out["after destroy"] = [tuple(p.shape) for p in copied.parameters()] == [
        tuple(p.shape) for p in engine.module.parameters()
    ]
    return out


@pytest.mark.zero3_world_size(1)
def test_a_hooked_module_refuses_its_deepcopy_at_the_call(zero3_world):
    """Why: a copy that runs the engine's hooks is neither plain torch's copy nor a refusal: its forward
    raises far from the copy and costs the engine its trace (contract 008-e's rule, seq-a)."""
    got = zero3_world.run(copies_of_a_persistent_model)[0]
    assert got["gathered"], got  # the case where torch's copy holds the weights
    assert got["model"].startswith("copy.deepcopy of the model (MLP)"), got
    assert got["submodule"].startswith("copy.deepcopy of module '2' (Linear)"), got
    assert got["inside GatheredParameters"].startswith("copy.deepcopy of the model"), got
    assert got["complete trace after"] and got["after destroy"], got
