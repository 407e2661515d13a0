"""Known-bad coordinator: no prefetch while the fetched module is in eval mode.

A coordinator that treats ``module.training == False`` as "inference, nothing to overlap" and skips
the prefetch: evaluation and generation loops (and a frozen tower put in ``eval()`` inside a training
model) then gather every module on demand.  DeepSpeed's ``fetch_sub_module`` never reads
``module.training``; the docs give no eval exception to ``stage3_prefetch_bucket_size``.  Silent: no
number changes.

Contract that must flag it: **rule-d** (exact prefetch, eval passes included).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class NoPrefetchInEval(ReferenceCoordinator):
    def fetch_sub_module(self, module, forward):
        self._module_training = module.training
        return super().fetch_sub_module(module, forward)

    def _prefetch(self) -> None:
        if not getattr(self, "_module_training", True):
            return  # the bug: modules in eval mode get no prefetch
        super()._prefetch()
