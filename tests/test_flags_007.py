"""Family 007's contracts flag DeepSpeed forks with one fix of DeepSpeed's history undone.

Each fork is the installed deepspeed copied (``tests/forks.py``) with the edits of one fix reverted:
a bug users of the ecosystem's entry points (PEFT, transformers) met and DeepSpeed fixed.  Run with
``--zero3-impl=DIR`` on family 007, each must FAIL the contract written for its path and pass the
others.  (007-a's and 007-d's known-bad implementations are coordinators: ``tests/flags.py``.)

Every run checks that each fork fails its contract; the proof run (``--proofs``) runs the whole family
per fork and checks that the other contracts pass.
"""

import pytest
from forks import bite_groups

#: fork name -> (contract that must flag it, [(file under deepspeed/, old text, new text)], what the edits
#: break, text the contract's failure must show: the fork's own failure, not another one)
LIFE_BUGS = {
    # DeepSpeed PR 8144 undone (issues 7203, 7615): the hook-state checks see attributes a wrapper
    # delegates to its child (PEFT's ModulesToSaveWrapper), so the wrapper gets the child's backward
    # hook classes and raises AttributeError ('ds_grads_remaining') in its forward
    "delegated_hook_state": (
        "007-c",
        [
            (
                "runtime/zero/parameter_offload.py",
                'if "pre_bwd_fn" not in module.__dict__:',
                'if not hasattr(module, "pre_bwd_fn"):',
            ),
            (
                "runtime/zero/parameter_offload.py",
                'if "applied_pre_backward_ref_cnt" not in ctx.module.__dict__:',
                'if not hasattr(ctx.module, "applied_pre_backward_ref_cnt"):',
            ),
            (
                "runtime/zero/parameter_offload.py",
                'if "post_bwd_fn" not in module.__dict__:',
                'if not hasattr(module, "post_bwd_fn"):',
            ),
        ],
        "ZeRO-3 hook state read through attribute-delegating wrappers (DeepSpeed PR 8144 undone)",
        "object has no attribute 'ds_grads_remaining'",
    ),
    # DeepSpeed PR 7566 undone: closing a zero.Init context "restores" the __init__ of a class without
    # one of its own from the first patched class up its MRO; for transformers' XForSequenceClassification
    # (GenericForSequenceClassification, a non-Module mixin, first) that is PreTrainedModel.__init__, so the
    # next from_pretrained of the class builds a model without its layers
    "unpatch_restores_inherited_init": (
        "007-b",
        [
            (
                "runtime/zero/partition_parameters.py",
                "if '__init__' in cls.__dict__ and hasattr(cls, '_old_init'):",
                "if hasattr(cls, '_old_init'):",
            ),
        ],
        "zero.Init's exit sets an inherited __init__ on classes without their own (DeepSpeed PR 7566 undone)",
        "reference copy (a second from_pretrained)",
    ),
    # The ds_id keying of shared params undone (DeepSpeed PRs 1223, 3407): the checkpoint's list of tied
    # params is found by data_ptr, which every partitioned param shares (its data is an empty tensor), so
    # zero_to_fp32 "recovers" every param as an alias of the first
    "shared_params_by_data_ptr": (
        "007-e",
        [
            (
                "runtime/engine.py",
                "                param_id = param.ds_id if is_zero3_model else param.data_ptr()\n",
                "                param_id = param.data_ptr()\n",
            ),
        ],
        "the checkpoint's shared params found by data_ptr under ZeRO-3 (DeepSpeed PRs 1223/3407 undone)",
        "zero_to_fp32: blocks.0.lin.weight has shape",
    ),
    # DeepSpeed PR 1146 undone: the checkpoint lists no buffer names, so zero_to_fp32 recovers no buffer
    "buffers_not_recovered": (
        "007-e",
        [("runtime/engine.py", '        get_layer_named_buffers(self.module, prefix="")\n', "")],
        "no buffer names in the checkpoint: zero_to_fp32 restores no buffer (DeepSpeed PR 1146 undone)",
        "missing ['scale']",
    ),
}

#: Proven by the proof run only: 007-e already bites in every run on the first of its forks.
PROOF_ONLY = frozenset({"buffers_not_recovered"})

#: The cheap runs share one fork: no two bugs of one contract.
BITE_GROUPS = bite_groups({name: ({bug[0]}, set()) for name, bug in LIFE_BUGS.items() if name not in PROOF_ONLY})


@pytest.fixture(scope="module")
def life_fork(tmp_path_factory):
    """``life_fork(name)``: the fork ``name`` of :data:`LIFE_BUGS`, or one with every edit of a
    :data:`BITE_GROUPS` group named ``"a+b"`` (built once)."""
    from forks import ForkCache

    edits = {name: bug[1] for name, bug in LIFE_BUGS.items()}
    edits.update({"+".join(g): [e for name in g for e in edits[name]] for g in BITE_GROUPS})
    return ForkCache(tmp_path_factory, edits)


@pytest.mark.parametrize("group", BITE_GROUPS, ids="+".join)
def test_life_forks_fail_their_contracts(run_suite, life_fork, group):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run:
    one fork per group, each contract failing with its own edit's failure)."""
    contracts = sorted(LIFE_BUGS[name][0] for name in group)
    run = run_suite(life_fork("+".join(group)), ",".join(contracts))
    outcomes = run.outcomes()
    for name in group:
        contract, _, bug, cause = LIFE_BUGS[name]
        assert outcomes.get(contract) == "fail", (
            f"{contract} should flag the fork where {bug}, got {outcomes}\n{run.stdout[-4000:]}"
        )
        assert cause in run.stdout, f"{contract} failed, but not with {cause!r}:\n{run.stdout[-4000:]}"


@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(LIFE_BUGS))
def test_suite_flags_life_fork_with_its_contract(run_suite, life_fork, name):
    """Why: each fork differs from stock 0.19.8 by one fix undone, so the family's other contracts must
    let it through, except where stock itself fails (007-a: the attached module's step; 007-d: the crash
    on a replaced param; see the 0.19.8 expectations)."""
    contract, _, bug, _ = LIFE_BUGS[name]
    run = run_suite(life_fork(name), "007")
    outcomes = run.outcomes()
    assert outcomes.get(contract) == "fail", f"{contract} should flag the fork where {bug}: {outcomes}"
    others = {cid: out for cid, out in outcomes.items() if cid not in (contract, "007-a", "007-d") and out != "pass"}
    assert not others, f"contracts the edit should not reach did not pass: {others}\n{run.stdout[-4000:]}"
