"""Family 005's contracts flag DeepSpeed forks whose engine around the coordinator has one edit.

Each fork is the installed deepspeed copied (``tests/forks.py``) with one small edit to the code
around the coordinator, each modelled on a kind of bug DeepSpeed has had: the backward hooks skip a
container type, ``GatheredParameters`` drops a modifier's edit, ``destroy()`` forgets hooks, a hook
re-registration keeps a stale trace (DeepSpeed PR 8043 undone), the reduce-scatter skips the padding
of a lone uneven gradient, ``zero_to_fp32`` miscounts uneven partitions.  Run with
``--zero3-impl=DIR`` on family 005, each must FAIL the contract written for its bug and pass the
other four (005-f, which stock fails already, is left out).

Every run checks that each fork fails its contract (one contract per run); the proof run
(``--proofs``) runs the family per fork and checks that the other four pass.
"""

import pytest
from flags import family
from forks import FIX_REWRAP, bite_groups

#: fork name -> (contract that must flag it, file under deepspeed/, old text, new text, what the edit breaks)
ENGINE_BUGS = {
    # the pre-backward hook is applied to tensors in tuples and lists but not in dicts, so a module
    # returning a dict (or a transformers ModelOutput) is not gathered for its backward
    "dict_outputs_unhooked": (
        "005-a",
        "runtime/zero/utils.py",
        "value[key] = apply_to_tensors_only(function, value[key])",
        "pass",
        "backward hooks not applied to tensors inside dict outputs",
    ),
    # the modifier rank's edit is broadcast but the partitions are not refreshed from it at exit
    "modifier_edit_dropped": (
        "005-b",
        "runtime/zero/partition_parameters.py",
        "self._partition_params(params_to_partition, has_been_updated=True)",
        "self._partition_params(params_to_partition, has_been_updated=False)",
        "GatheredParameters(modifier_rank=...) exit keeps the old partitions",
    ),
    # destroy() removes the module hooks but not the params' gradient-accumulation hooks
    "destroy_keeps_grad_hooks": (
        "005-c",
        "runtime/zero/stage3.py",
        "        for hook in self._grad_acc_hooks:\n            hook.remove()\n",
        "",
        "destroy() leaves the gradient-accumulation hooks",
    ),
    # the single-gradient fast path (no padding, no copy) is taken for uneven gradients too: a reduce
    # bucket smaller than one param reduces each gradient alone, unpadded
    "lone_uneven_gradient_unpadded": (
        "005-d",
        "runtime/comm/coalesced_collectives.py",
        "if len(tensors) == 1 and tensors[0].numel() % world_sz == 0:",
        "if len(tensors) == 1:",
        "reduce_scatter_coalesced reduces a lone uneven gradient without padding",
    ),
    # DeepSpeed PR 8043 undone: re-registering the hooks (unwrap_model_for_generation) keeps the
    # coordinator's trace, recorded under the modules' old ids; the next forward's reset_step fails
    "stale_trace_after_reregistration": (
        "005-c",
        "runtime/zero/parameter_offload.py",
        "                coordinator._invalidate_trace()",
        "                pass",
        "hook re-registration leaves the coordinator's trace stale (DeepSpeed PR 8043 undone)",
    ),
    # zero_to_fp32 takes each partition's size rounded down: uneven partitions are cut short
    "zero_to_fp32_rounds_down": (
        "005-e",
        "utils/zero_to_fp32.py",
        "partitioned_numel = math.ceil(unpartitioned_numel / world_size)",
        "partitioned_numel = unpartitioned_numel // world_size",
        "zero_to_fp32 rounds uneven partition sizes down",
    ),
}


#: The family less 005-f, which stock 0.19.8 (and so every copy of it) fails already: what the proof runs.
SELECT = ",".join(sorted(family("005", but=("005-f",))))

#: The cheap runs share forks: two bugs of one contract (005-c) never share one.
BITE_GROUPS = bite_groups({name: ({bug[0]}, set()) for name, bug in ENGINE_BUGS.items()})


@pytest.fixture(scope="module")
def engine_fork(tmp_path_factory):
    """``engine_fork(name)``: the fork ``name`` of :data:`ENGINE_BUGS`, or one with every edit of a
    :data:`BITE_GROUPS` group named ``"a+b"`` (built once)."""
    from forks import ForkCache

    # stock's own 005-c bug fixed first (forks.FIX_REWRAP): 005-c then judges the edit, not stock
    edits = {name: [FIX_REWRAP, bug[1:4]] for name, bug in ENGINE_BUGS.items()}
    edits.update({"+".join(g): [e for name in g for e in edits[name]] for g in BITE_GROUPS})
    return ForkCache(tmp_path_factory, edits)


@pytest.mark.parametrize("group", BITE_GROUPS, ids="+".join)
def test_engine_forks_fail_their_contracts(run_suite, engine_fork, group):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run:
    one fork per group; that each edit fails its contract alone is the proof run's, one fork per edit)."""
    contracts = sorted(ENGINE_BUGS[name][0] for name in group)
    run = run_suite(engine_fork("+".join(group)), ",".join(contracts))
    from forks import unbitten

    wrong = unbitten(run, ENGINE_BUGS, group)
    assert not wrong, f"the contract of each edit should fail, got {wrong}; all: {run.outcomes()}\n{run.stdout[-4000:]}"


@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(ENGINE_BUGS))
def test_suite_flags_engine_fork_with_its_contract(run_suite, engine_fork, name):
    """Why: these forks differ from stock 0.19.8 by one edit, so the other contracts of the family
    must let them through (the whole proof: --proofs, scripts/proofs.sh)."""
    contract, _, _, _, bug = ENGINE_BUGS[name]
    run = run_suite(engine_fork(name), SELECT)
    outcomes = run.outcomes()
    assert outcomes.get(contract) == "fail", (
        f"{contract} should flag the fork where {bug}, got {outcomes.get(contract)}; "
        f"all: {outcomes}\n{run.stdout[-4000:]}"
    )
    others = {cid: out for cid, out in outcomes.items() if cid != contract and out != "pass"}
    assert not others, f"contracts the edit should not reach did not pass: {others}\n{run.stdout[-4000:]}"
    assert set(outcomes) >= {c for c, *_ in ENGINE_BUGS.values()}, f"not every family-005 contract ran: {outcomes}"
