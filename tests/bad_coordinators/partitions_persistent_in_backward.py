"""Known-bad coordinator: persistent params partitioned by backward releases.

The backward release frees every param of the module without the ``ds_persist`` exception that the
forward release has (a copy of the release path that lost one condition).  Persistent params are
then partitioned and gathered again within the step; stage 3's post-step re-gather of persistent
params hides it from every check made after ``step()``.

Contract that must flag it: **rule-e** (persistence within a step); see tests/flags.py.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator
from pytest_zero3.reference_impl.trace import module_params

from pytest_zero3 import reference_impl

reference_impl.install()


class PartitionsPersistentInBackward(ReferenceCoordinator):
    def release_sub_module(self, module, forward=False):
        super().release_sub_module(module, forward)
        if not forward:
            for param in module_params(module):
                if param.ds_persist and not param.is_external_param:
                    self._release(param)  # the bug: no ds_persist exception in backward
