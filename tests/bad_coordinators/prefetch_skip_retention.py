"""Known-bad coordinator: the prefetch-skip retention (DeepSpeed #2016, fixed by PR 9003, issue 7670).

The reference coordinator with exactly one bug put back, as deepspeed 0.19.8 has it: prefetch records,
for every param it walks past in the trace (skipped because already gathered, or being gathered),
the step of that use, and release keeps the param until then, for every param (the reference keeps
this only for NVMe-offloaded params, whose swap buffers need it).  Prefetch sees the backward use of
each forward-gathered param, so with prefetch on every layer stays gathered until backward even at
``stage3_max_reuse_distance=0``.

Contract that must flag it: **000-a** (and nothing outside family 000; see tests/flags.py).

Use: ``--zero3-impl=tests/bad_coordinators/prefetch_skip_retention.py:PrefetchSkipRetention``.
Importing this file installs ``reference_impl`` (its engine-lifecycle and config patches), so that
the only difference from ``--zero3-impl=reference`` is this class.
"""

from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()


class PrefetchSkipRetention(ReferenceCoordinator):
    def _prefetch(self) -> None:
        start = self._cursor
        super()._prefetch()
        for use in self._trace.param_uses[start : self._cursor]:  # the bug: keep every scanned param until this use
            self._nvme_keep_until[use.param] = max(use.step, self._nvme_keep_until.get(use.param, -1))
