"""base-j accepts a clear refusal of a z3 leaf whose input has no grad; these DeepSpeed forks show where
that acceptance ends.

base-j passes an implementation that trains such a leaf like plain torch, or that refuses it before
any weight changes: an exception in step 0's forward or backward naming the leaf's class and saying
that its input has no grad (DeepSpeed's own ``test_no_grad_input_error`` expects a refusal).  Each
fork is the installed deepspeed copied (``tests/forks.py``) with one thing added to
``create_reduce_and_remove_grad_hooks``, a forward pre-hook on every z3 leaf:

* ``unclear_refusal`` raises the message DeepSpeed's unit test expects, "inputs with
  requires_grad=False is not supported for a leaf module", which names no module: a user with several
  leaves cannot tell which one; base-j must FAIL it, saying so (every run);
* ``clear_refusal`` raises a message naming the leaf's class: base-j must pass it (proof run);
* ``grad_alias`` hands the leaf a grad-requiring alias of its input (the reference's fix before the
  gate of ``reference_impl/leaf.py``): the leaf trains, but a reentrant checkpoint inside it then
  computes gradients plain torch never computes; base-j must FAIL it on that run alone (proof run).

Stock 0.19.8's own failure (an obscure crash in AccumulateGrad) is the known failure of the 0.19.8
expectations.
"""

import pytest

STAGE3 = "runtime/zero/stage3.py"
CLASS_LINE = "class DeepSpeedZeroOptimizer_Stage3(ZeROOptimizer):\n"
LEAF_HOOK_LINE = (
    "            self._leaf_module_hooks.append(leaf_module.register_full_backward_hook(make_hook(leaf_parameters)))\n"
)
NO_GRAD_INPUT = "torch.is_grad_enabled() and not any(torch.is_tensor(a) and a.requires_grad for a in args)"


def _leaf_pre_hook(name: str, body: str, prepend: bool = False) -> list:
    """The two edits of a fork: the forward pre-hook ``name`` (``body``, run when no input of the leaf
    requires grad) defined before the optimizer class, and registered on every z3 leaf."""
    hook = f"def {name}(module, args):\n    if {NO_GRAD_INPUT}:\n{body}\n\n\n"
    register = f"            self._leaf_module_hooks.append(leaf_module.register_forward_pre_hook({name}, prepend={prepend}))\n"
    return [(STAGE3, CLASS_LINE, hook + CLASS_LINE), (STAGE3, LEAF_HOOK_LINE, LEAF_HOOK_LINE + register)]


#: fork name -> its edits
FORKS = {
    "unclear_refusal": _leaf_pre_hook(
        "_refuse_leaf",
        '        raise RuntimeError("inputs with requires_grad=False is not supported for a leaf module")',
    ),
    "clear_refusal": _leaf_pre_hook(
        "_refuse_leaf",
        '        raise RuntimeError(f"z3 leaf module {type(module).__name__}: none of its inputs requires grad, "\n'
        '                           "so ZeRO-3 cannot tell when its gradients are complete")',
    ),
    "grad_alias": _leaf_pre_hook(
        "_alias_leaf_input",
        "        return tuple(a.detach().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() else a\n"
        "                     for a in args)",
        prepend=True,
    ),
}


@pytest.fixture(scope="module")
def leaf_fork(tmp_path_factory):
    """``leaf_fork(name)``: the fork ``name`` of :data:`FORKS` (built once)."""
    from forks import ForkCache

    return ForkCache(tmp_path_factory, FORKS)


def test_unclear_refusal_fails_base_j(run_suite, leaf_fork):
    """Why: accepting a refusal must not accept any exception: one that does not name the leaf fails
    base-j, as a refusal judged unclear (not as a crash or a hang)."""
    run = run_suite(leaf_fork("unclear_refusal"), "base-j")
    assert run.outcomes().get("base-j") == "fail", f"base-j should flag the unclear refusal:\n{run.stdout[-4000:]}"
    assert "which is no clear refusal: it does not name the leaf module (Experts)" in run.stdout, run.stdout[-4000:]


@pytest.mark.proof
def test_clear_refusal_passes_base_j(run_suite, leaf_fork):
    """Why: the acceptance must be reachable: a refusal naming the leaf's class passes base-j."""
    run = run_suite(leaf_fork("clear_refusal"), "base-j")
    assert run.outcomes().get("base-j") == "pass", f"base-j should pass the clear refusal:\n{run.stdout[-4000:]}"


@pytest.mark.proof
def test_grad_alias_fails_base_j(run_suite, leaf_fork):
    """Why: an implementation that trains the leaf must train it like plain torch; the grad alias
    trains the reentrant checkpoint's params, and base-j flags that run only."""
    run = run_suite(leaf_fork("grad_alias"), "base-j")
    assert run.outcomes().get("base-j") == "fail", f"base-j should flag the grad alias:\n{run.stdout[-4000:]}"
    assert "reentrant checkpoint in the leaf: final weight 0.body.0.weight" in run.stdout, run.stdout[-4000:]
    trained_right = (
        "set_z3_leaf_modules",
        "set_z3_leaf_modules, prefetch 5e7",
        "granularity threshold",
        "threshold, prefetch 5e7",
    )
    flagged = [label for label in trained_right if f"z3 leaf on the first block, {label}:" in run.stdout]
    assert not flagged, f"base-j flagged runs the alias trains right: {flagged}\n{run.stdout[-4000:]}"
