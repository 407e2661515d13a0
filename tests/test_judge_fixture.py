"""The ``zero3_judge`` fixture: a user's test that builds a ZeRO-3 engine in its own process and
judges it fails with the violations, and passes on the reference.

One pytest subprocess (the engine and its 1-rank process group live in that pytest's process, as in a
single-process or torchrun-launched test): two tests, reference and
``tests/bad_coordinators/backward_defers_release.py`` (backward releases left to the end-of-backward
sweep: rule-b, visible at one rank).
"""

from pathlib import Path

import pytest

BAD = Path(__file__).resolve().parent / "bad_coordinators" / "backward_defers_release.py"

USER_TEST = """
import os
import pytest
import torch
from pytest_zero3 import dsops, impl


def engine_under(spec, tmp_path):
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        dsops.skip_cpu_shm_comm_op()
        deepspeed.init_distributed(dist_backend="gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    impl.apply(impl.parse(spec))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    config = {
        "train_batch_size": 2,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


@pytest.mark.parametrize("spec", ["reference", "BAD:BackwardDefersRelease"])
def test_user_engine(zero3_judge, spec, tmp_path):
    engine = engine_under(spec, tmp_path)
    with zero3_judge(engine):
        for step in range(3):
            engine.backward(engine(torch.randn(2, 16)).pow(2).mean())
            engine.step()
"""


@pytest.mark.slow  # its own pytest: imports torch and deepspeed, builds two engines
def test_fixture_fails_a_users_test_with_the_violations(run_pytest, tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TEST.replace("BAD", str(BAD)))
    run = run_pytest(str(tmp_path / "test_user.py"), "-v", cwd=tmp_path, timeout=300)
    assert "test_user_engine[reference] PASSED" in run.stdout, run.stdout[-3000:]
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    assert "RuleViolations" in run.stdout and "rule-b: step 1, event" in run.stdout, run.stdout[-3000:]
    assert "The rules broken:" in run.stdout, run.stdout[-3000:]
