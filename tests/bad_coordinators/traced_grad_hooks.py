"""Known-bad coordinator: stage 3's gradient hooks left for compiled autograd to trace.

Under ``engine.compile(compiled_autograd_enabled=True)`` compiled autograd captures the whole
backward, stage 3's post-accumulate-grad hook included, and hands it to dynamo.  Dynamo runs the hook
on a fake copy of the partitioned param (1-D, its gradient 2-D), and the hook's process-group
comparison fails ``AssertionError: 1 != 2`` in the first backward (docs/repro/compiled_autograd_hook.py).
The reference registers each hook wrapped in ``torch.compiler.disable`` (a graph break: the hook runs
eagerly); this is the reference with that row of its install table put back to DeepSpeed's own
``register_grad_hook``.

The coordinator class is the reference's own: the bug lives beside it.  Under fp32, 008-m compiles with
dynamo disabled (compiled autograd captures, nothing is traced), so only the compile profile can see
it.  Contract that must flag it: **008-m** under ``--zero3-profile=compile``.
"""

from deepspeed.runtime.zero import stage3
from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()
stage3.register_grad_hook = stage3.register_grad_hook.__wrapped__  # the bug: DeepSpeed's hook, traced


class TracedGradHooks(ReferenceCoordinator):
    pass
