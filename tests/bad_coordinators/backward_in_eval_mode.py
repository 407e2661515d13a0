"""Known-bad coordinator: backward through a module in eval mode refused.

``assert sub_module.training, "backward pass is invalid for module in evaluation mode"`` in the
post-backward release: a frozen tower, an RLHF reference part or a dropout-free block put in
``eval()`` inside a training model gets gradients flowing through it (its input needs them), and the
step dies.  DeepSpeed has the line commented out in ``post_sub_module_backward_function``.

Contract that must flag it: **rule-a** (the step raised; anchor: a block in eval() while training).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class BackwardInEvalMode(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False) -> None:
        if not forward:
            assert module.training, "backward pass is invalid for module in evaluation mode"  # the bug
        super().release_sub_module(module, forward)
