"""Known-bad implementation: the contiguous gradient bucket one element short of reduce_bucket_size.

An off-by-one in the buffer's allocation (``reduce_bucket_size - 1`` elements, as a fork that reserves
a slot for a flag or counts from one would make it).  Stage 3 copies a gradient into the buffer when
the bucket's fill plus its numel is at most ``reduce_bucket_size``, so a bucket filled exactly to the
size writes one element past the buffer (a RuntimeError from ``narrow``).  Nothing shows while the
bucket is larger than the model (DeepSpeed's default, and every contract's config but the drawn
ones): only a bucket size landing exactly on a fill the backward reaches, as HF's ``"auto"``
``reduce_bucket_size`` (hidden size squared, a weight's numel) does.  The coordinator is the
reference's, unchanged.

Contract that must flag it: **008-f** (every size key at the model's boundaries); see tests/flags.py.
"""

import functools

from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from pytest_zero3.reference_impl import ReferenceCoordinator

from pytest_zero3 import reference_impl

reference_impl.install()
_init = DeepSpeedZeroOptimizer_Stage3.__init__


@functools.wraps(_init)
def _init_one_short(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    for bucket in self.ipg_buckets.values():
        if getattr(bucket, "buffer", None) is not None:
            bucket.buffer = bucket.buffer[:-1]  # the bug: reduce_bucket_size - 1 elements


DeepSpeedZeroOptimizer_Stage3.__init__ = _init_one_short


class IpgBufferOneShort(ReferenceCoordinator):
    """The reference coordinator; the bug is in the optimizer's bucket (patched at import)."""
