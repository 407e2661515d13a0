"""Known-bad coordinator: serves each external param's first gathered copy on later fetches.

An external param (another module's weight used in this module's forward, registered by
``register_external_parameter`` or by DeepSpeed's getter) is fetched by the using module as well as
by its owner.  This coordinator keeps the using module's first gathered copy "to save a gather" and
writes it back on every later fetch: the residency and the all-gathers are exactly the reference's,
but the module computes with the weight of step 0 while the optimizer updates the partition.  Only
the numbers show it, and only on a model with an external param: no hand-written scenario has one.

Contract that must flag it: **rule-h** (the generated family's parity with plain torch).
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class StaleExternalParams(ReferenceCoordinator):
    def fetch_sub_module(self, module, forward):
        super().fetch_sub_module(module, forward)
        first_copy = self.__dict__.setdefault("_first_external_copy", {})
        for _, param in module.ds_external_parameters():
            if param.ds_id not in first_copy:
                first_copy[param.ds_id] = param.data.detach().clone()
            else:
                param.data.copy_(first_copy[param.ds_id])  # the bug: a stale copy for an updated param
