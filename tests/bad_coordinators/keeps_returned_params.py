"""Known-bad coordinator: a param a module returns from its forward is never released by a hook.

DeepSpeed's post-forward hook registers a param found in a module's outputs (a learned positional
embedding or offset module returning ``self.weight``) as an external param of the calling module and
marks it ``is_external_param`` for good.  DeepSpeed 0.19.8's coordinator skips every param so marked in
``release_sub_module`` and ``release_backward_leftovers``, whichever module releases: the caller never
partitions it and neither does the end of backward, so it stays gathered until the optimizer step (in a
no-grad loop, for good).  This is the reference with that skip put back (``docs/repro/
returned_param_stays_gathered.py`` shows it on stock).

No hand-written scenario has a module that returns its own param.  Contract that must flag it:
**rule-b** (on a complete trace a module's params are partitioned when its hook ends unless reused,
persistent or claimed), on the rule family's ``returns`` anchor.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class KeepsReturnedParams(ReferenceCoordinator):
    _skip_external = False

    def release_sub_module(self, module, forward=False):
        self._skip_external = True
        try:
            super().release_sub_module(module, forward)
        finally:
            self._skip_external = False

    def release_backward_leftovers(self):
        self._skip_external = True
        try:
            super().release_backward_leftovers()
        finally:
            self._skip_external = False

    def _release(self, param, free_data=True):
        if self._skip_external and param.is_external_param:
            return  # the bug: DeepSpeed's skip of every param marked external, at every hook
        super()._release(param, free_data)
