"""A z3 leaf module whose input has no grad: the gradient hook DeepSpeed puts on it fires too early.

ZeRO-3 reduces a leaf module's gradients in a full backward hook on the leaf
(``DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks``).  When none of the leaf's
inputs requires grad (the first block of a model, fed raw data; a block after one run under
``no_grad``), torch fires a full backward hook as soon as the gradients of the module's *outputs* are
known, before autograd has computed the leaf's parameter gradients.  DeepSpeed then reduces zero
placeholders, removes them, and the real gradients arrive afterwards into a partitioned param: step
0's backward fails with "output with shape [1] doesn't match the broadcast shape" or "The size of
tensor a (0) must match".

The fix holds DeepSpeed's hook back, not the leaf's input: when the hook fires while a parameter
gradient of the leaf that this backward computes has not been accumulated yet, it runs once the last
of them has been (a post-accumulate-grad hook on each of the leaf's params notes which backward last
accumulated it; ``torch._C._will_engine_execute_node`` says which ones this backward computes, as
DeepSpeed's own ``count_used_parameters_in_backward`` asks).  The leaf's forward sees exactly the
inputs plain torch gives it, so a forward whose graph depends on them (a reentrant activation
checkpoint, which computes no parameter gradient for an input without grad) trains as in plain torch.
An earlier fix handed the leaf a grad-requiring alias of its input, and made such a checkpoint train
params that plain torch leaves alone.
"""

import functools
import threading

import torch
from torch.autograd.graph import _get_grad_fn_or_grad_acc


def _grad_node(param):
    """``param``'s AccumulateGrad node as autograd has it now (a new one once it was reset)."""
    with torch.enable_grad():  # backward hooks run with grad off; the lookup needs it
        return _get_grad_fn_or_grad_acc(param)


def _no_grad_input(args) -> bool:
    return not any(torch.is_tensor(a) and a.requires_grad for a in args)


class LeafGradGate:
    """DeepSpeed's full backward hook of one z3 leaf, run only once the leaf's parameter gradients that
    the running backward computes are all accumulated (at once when they are, as for a leaf whose input
    has grad).

    Which ones it computes is asked of the AccumulateGrad nodes the leaf's forward built on, recorded
    as it ends: autograd resets a param's node when the param's data changes dtype, as a partitioned
    bf16 param's placeholder does, so a lookup in backward can find a node the graph never saw.  A
    forward inside a backward (a checkpoint's recompute) is recorded apart, since a reentrant
    checkpoint's backward runs its recompute's graph and a non-reentrant one the original graph.
    """

    def __init__(self, hook, params):
        self.hook = hook
        self.params = [p for p in params if p.requires_grad]
        self._nodes: tuple[dict, dict] = ({}, {})  # id(param) -> node, of the last forward / recompute
        self._accumulated = {}  # id(param) -> the graph task that last accumulated its gradient
        self._waiting = None  # (ids still to come, the hook's arguments)
        self._lock = threading.Lock()

    def register(self, leaf) -> list:
        """The gate's hooks: the post-accumulate-grad hooks on the leaf's params, and the forward hook
        that records their nodes, first in line (before DeepSpeed's releases the params); their
        handles, for ``destroy()``."""
        handles = [p.register_post_accumulate_grad_hook(self._accumulate) for p in self.params]
        return [*handles, leaf.register_forward_hook(self._record, prepend=True)]

    def _record(self, module, args, output) -> None:
        if not torch.is_grad_enabled() or not _no_grad_input(args):
            return  # no graph, or the hook fires after the params' gradients: nothing to look up
        forward, recompute = self._nodes
        in_backward = torch._C._current_graph_task_id() != -1
        for p in self.params:
            (recompute if in_backward else forward)[id(p)] = _grad_node(p)
            if not in_backward:
                recompute.pop(id(p), None)

    def _computed_this_backward(self, param) -> bool:
        """Whether the running backward accumulates a gradient into ``param``."""
        nodes = [n[id(param)] for n in self._nodes if id(param) in n] or [_grad_node(param)]
        return any(torch._C._will_engine_execute_node(node) for node in nodes)

    def _accumulate(self, param) -> None:
        with self._lock:
            self._accumulated[id(param)] = torch._C._current_graph_task_id()
            if self._waiting is None:
                return
            left, args = self._waiting
            left.discard(id(param))
            if left:
                return
            self._waiting = None
        self.hook(*args)

    def __call__(self, module, grad_input, grad_output):
        task = torch._C._current_graph_task_id()
        with self._lock:
            left = {
                id(p) for p in self.params if self._accumulated.get(id(p)) != task and self._computed_this_backward(p)
            }
            if left:
                self._waiting = (left, (module, grad_input, grad_output))
                return None
        return self.hook(module, grad_input, grad_output)


def create_hooks_with_leaf_gate(original):
    """Wrap ``create_reduce_and_remove_grad_hooks``: each leaf's full backward hook, as DeepSpeed registered
    it, is replaced in place by a :class:`LeafGradGate` around it; the gate's hooks are kept with the
    leaf hooks so that ``destroy()`` removes them."""

    @functools.wraps(original)
    def create_reduce_and_remove_grad_hooks(self):
        before = len(self._leaf_module_hooks)
        original(self)
        ids = {handle.id for handle in self._leaf_module_hooks[before:]}
        for leaf, params in getattr(self, "leaf_parameters", {}).items():
            for key in ids.intersection(leaf._backward_hooks):
                gate = LeafGradGate(leaf._backward_hooks[key], params)
                leaf._backward_hooks[key] = gate
                self._leaf_module_hooks.extend(gate.register(leaf))

    return create_reduce_and_remove_grad_hooks
