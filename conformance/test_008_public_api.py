"""Family 008: the public API around a ZeRO-3 step (tensor-fragment reads and writes, the global norm).

Trainers call these between backward and step: HF's Trainer logs ``get_global_grad_norm()``, RL and
distillation code reads full gradients, model surgery writes fp32 masters and optimizer states.  Each
value returned is compared with the plain-torch twin's, and each write is made on both sides, under
HF-style param groups, accumulation and clipping, with the optimizer on the device and offloaded (one
test each: a failure of one does not hide the other).
Scenarios: :mod:`pytest_zero3.fixtures.family_008`.
"""

import pytest
from pytest_zero3.conformance.conftest import CPU_ADAM_PRELOAD as CPU_ADAM
from pytest_zero3.fixtures import family_008 as f8
from pytest_zero3.fixtures import verdicts


# DeepSpeedCPUAdam (the offload variant's optimizer) built in the forkserver, never inside a scenario's timeout
@pytest.mark.zero3_preload(CPU_ADAM)
@pytest.mark.zero3_contract("008-a")
@pytest.mark.parametrize("variant", tuple(f8.VARIANTS))
def test_fragment_reads_equal_the_twin(zero3_world, variant):
    """After every backward: ``safe_get_full_grad`` and ``safe_get_local_grad`` (this rank's slice of
    the accumulated gradient); after every step: ``get_global_grad_norm()`` (the norm before clipping,
    the norm torch's clipping returns), the fp32 masters and Adam's moments, full and local."""
    verdicts.assert_clean(zero3_world.run(f8.fragment_api, variant, False), f"tensor-fragment reads ({variant})")


@pytest.mark.zero3_preload(CPU_ADAM)
@pytest.mark.zero3_contract("008-b")
@pytest.mark.parametrize("variant", tuple(f8.VARIANTS))
def test_fragment_writes_train_like_the_twin(zero3_world, variant):
    """``safe_set_full_grad``, ``safe_set_local_grad``, ``safe_set_full_fp32_param`` and
    ``safe_set_full_optimizer_state`` between the last backward of a step and the step: the step
    clips by the norm of the gradients as written and starts from the written master and moments;
    every later read and the final weights equal the twin's that made the same writes."""
    verdicts.assert_clean(zero3_world.run(f8.fragment_api, variant, True), f"tensor-fragment writes ({variant})")
