"""A z3 leaf module whose input has no grad: the gradient hook DeepSpeed puts on it fires too early.

ZeRO-3 reduces a leaf module's gradients in a full backward hook on the leaf
(``DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks``).  When none of the leaf's
inputs requires grad (the first block of a model, fed raw data), torch fires a full backward hook as
soon as the gradients of the module's *outputs* are known, before autograd has computed the leaf's
parameter gradients.  DeepSpeed then reduces zero placeholders, removes them, and the real gradients
arrive afterwards into a partitioned param: step 0's backward fails with "output with shape [1]
doesn't match the broadcast shape" or "The size of tensor a (0) must match".

The fix sits around the coordinator, at the leaf's input: a forward pre-hook, run before DeepSpeed's
own, hands the leaf a grad-requiring alias of a floating-point input that has none (``detach()``
shares storage; the values and the user's graph are unchanged).  The full backward hook then fires
when the input's gradient is computed, after the parameters' (autograd runs ``AccumulateGrad`` first),
exactly as for a leaf deeper in the model.
"""

import functools

import torch


def _needs_grad_input(args) -> bool:
    tensors = [a for a in args if torch.is_tensor(a)]
    return bool(tensors) and not any(t.requires_grad for t in tensors)


def _grad_alias(module, args):
    """Forward pre-hook of a z3 leaf: with grad on and no input requiring it, alias one that can."""
    if not torch.is_grad_enabled() or not _needs_grad_input(args):
        return None
    out, done = [], False
    for a in args:
        if not done and torch.is_tensor(a) and a.is_floating_point():
            a, done = a.detach().requires_grad_(True), True
        out.append(a)
    return tuple(out) if done else None


def create_hooks_with_grad_alias(original):
    """Wrap ``create_reduce_and_remove_grad_hooks``: each leaf also gets :func:`_grad_alias`, first in
    line, its handle kept with the leaf hooks so that ``destroy()`` removes it."""

    @functools.wraps(original)
    def create_reduce_and_remove_grad_hooks(self):
        original(self)
        for leaf in getattr(self, "leaf_parameters", {}):
            self._leaf_module_hooks.append(leaf.register_forward_pre_hook(_grad_alias, prepend=True))

    return create_reduce_and_remove_grad_hooks
