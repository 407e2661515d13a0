"""Family 004's contracts flag DeepSpeed forks whose save path has one line changed.

Each fork is the installed deepspeed copied (``tests/forks.py``) with exactly one line of the
checkpoint save path changed, the kind of edit a fork makes while touching partitioning, gathering or
the engine's save code.  Run with ``--zero3-impl=DIR`` on family 004, each must FAIL the contract
written for its bug; the other 004 contracts must pass unless their scenario also takes the broken
path (listed per fork, with why).
"""

import pytest
from forks import bite_groups

#: contract -> (file under deepspeed/, old text, new text, other contracts that must flag it too,
#: contracts whose scenario also takes the broken path and may fail)
SAVE_PATH_BUGS = {
    # the step counter is written as 0: a resumed engine restarts its global step (tags, schedules)
    "004-a": ("runtime/engine.py", "global_steps=self.global_steps,", "global_steps=0,", set(), set()),
    # the 16-bit state dict is taken without gathering: rank 0 writes its torch.Size([0]) placeholders;
    # the HF adapter save (004-d) consolidates through the same function, so it must fail too;
    # 004-f's mid-training save also writes a 16-bit model
    "004-b": (
        "runtime/engine.py",
        "with deepspeed.zero.GatheredParameters(module_params, modifier_rank=0):",
        "with deepspeed.zero.GatheredParameters([], modifier_rank=0):",
        {"004-d"},
        {"004-f"},
    ),
    # frozen params' shapes are taken from the placeholder instead of ds_shape; 004-f consolidates
    # its mid-training checkpoints with zero_to_fp32 too
    "004-c": (
        "runtime/engine.py",
        "return param.ds_shape if hasattr(param, 'ds_id') else param.shape",
        "return param.shape",
        set(),
        {"004-f"},
    ),
    # the save gathers every param first (so the module state dict looks full) and never releases them
    "004-f": (
        "runtime/zero/stage3.py",
        "def checkpoint_event_prologue(self):\n        self._partition_all_parameters()",
        "def checkpoint_event_prologue(self):\n"
        "        self.module.parameters().__next__().all_gather(param_list=list(self.module.parameters()))",
        set(),
        set(),
    ),
}
#: The contracts every fork run checks, plus the fork's own extra flags.  Left out: 004-e and 004-g,
#: which stock 0.19.8 (and so every copy of it) fails already, and 004-d (a transformers preload)
#: except where the fork must trip it.
SELECT = ("004-a", "004-b", "004-c", "004-f")


#: The cheap runs share forks: bugs none of whose contracts another bug of the group may fail.
BITE_GROUPS = bite_groups({cid: ({cid} | bug[3], bug[4]) for cid, bug in SAVE_PATH_BUGS.items()})


@pytest.fixture(scope="module")
def save_path_fork(tmp_path_factory):
    """``save_path_fork(name)``: a fork with the save-path line of contract ``name`` changed, or of every
    contract of a :data:`BITE_GROUPS` group named ``"a+b"`` (built once)."""
    from forks import ForkCache

    edits = {cid: [bug[:3]] for cid, bug in SAVE_PATH_BUGS.items()}
    edits.update({"+".join(g): [e for cid in g for e in edits[cid]] for g in BITE_GROUPS})
    return ForkCache(tmp_path_factory, edits)


@pytest.mark.parametrize("group", BITE_GROUPS, ids="+".join)
def test_save_path_forks_fail_their_contracts(run_suite, save_path_fork, group):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run:
    one fork per group; which bug fails which contract alone is the proof run's, one fork per bug)."""
    flagged = sorted({c for cid in group for c in {cid} | SAVE_PATH_BUGS[cid][3]})
    run = run_suite(save_path_fork("+".join(group)), ",".join(flagged))
    outcomes = run.outcomes()
    wrong = {cid: outcomes.get(cid) for cid in flagged if outcomes.get(cid) != "fail"}
    assert not wrong, (
        f"{flagged} should flag the fork with the save-path bugs of {group}, got {wrong}\n{run.stdout[-4000:]}"
    )


@pytest.mark.proof
@pytest.mark.parametrize("contract", sorted(SAVE_PATH_BUGS))
def test_suite_flags_save_path_fork_with_its_contract(run_suite, save_path_fork, contract):
    """Why: these forks differ from stock 0.19.8 by one line of the save path, so the other contracts
    must let them through (the whole proof: --proofs, scripts/proofs.sh)."""
    _, _, _, flags, also = SAVE_PATH_BUGS[contract]
    selected = sorted(set(SELECT) | flags)
    run = run_suite(save_path_fork(contract), ",".join(selected))
    outcomes = run.outcomes()
    wrong = {cid: outcomes.get(cid) for cid in {contract} | flags if outcomes.get(cid) != "fail"}
    assert not wrong, (
        f"{sorted({contract} | flags)} should flag the {contract} save-path fork, got {wrong}; "
        f"all: {outcomes}\n{run.stdout[-4000:]}"
    )
    others = {cid: out for cid, out in outcomes.items() if cid not in {contract} | flags | also and out != "pass"}
    assert not others, f"contracts the one-line change should not reach did not pass: {others}\n{run.stdout[-4000:]}"
    assert set(outcomes) >= set(selected), f"not every selected contract ran: {outcomes}"
