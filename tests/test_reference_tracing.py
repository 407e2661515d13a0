"""The reference raises stock's "tracing error" when a traced module's parameters change.

The trace records which parameters each step's module fetches, and prefetch gathers ahead from
that record.  A module that is the traced one but now fetches other parameters (an external
parameter registered after the trace was recorded, say) would be served from a stale plan; stock
raises ``RuntimeError("tracing error at step ...")`` there, and so must the reference, naming the
step and the parameters that changed.

Cost: one 1-rank world, 3 steps of a 3-layer MLP, about 5 s on the 2-core CI machine.
"""

import pytest
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.config import MICRO_BATCH, zero3_config
from pytest_zero3.fixtures.models import MLP, WIDTH

from pytest_zero3 import scenario


def changed_params_after_trace() -> str:
    import deepspeed

    from pytest_zero3 import reference_impl

    reference_impl.install()
    engine = eng.build(lambda: MLP(3), zero3_config(scenario.world_size()))
    for step in range(2):  # record, then one pass on the complete trace
        eng.train_step(engine, eng.batch(step, (MICRO_BATCH, WIDTH), 0, 1)[0])
    assert eng.coordinator(engine).is_complete_trace()
    first, last = engine.module[0], engine.module[4]
    deepspeed.zero.register_external_parameter(first, last.weight)
    try:
        eng.train_step(engine, eng.batch(2, (MICRO_BATCH, WIDTH), 0, 1)[0])
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@pytest.mark.zero3_world_size(1)
def test_changed_module_params_are_a_tracing_error(zero3_world):
    """Why: prefetch follows the recorded parameters; a silent mismatch gathers the wrong ones."""
    message = zero3_world.run(changed_params_after_trace)[0]
    assert message.startswith("tracing error at step 1"), message
    assert "new: [" in message and "gone: []" in message, message
