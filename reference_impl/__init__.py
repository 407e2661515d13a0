"""pytest-zero3's reference ZeRO-3 parameter coordinator for deepspeed 0.19.8.

``install()`` makes deepspeed build :class:`ReferenceCoordinator` instead of its own
``PartitionedParameterCoordinator`` (call it before ``deepspeed.initialize``, inside each rank);
``uninstall()`` restores deepspeed. The reference honours the contracts of DeepSpeed PRs 9003
(reuse distance alone decides release), 8883 (release decisions cached per trace, never shared or
mutated), 8130/8148 (frozen params across activation-checkpoint recompute) and 8431 (adaptive
prefetch bucket, opt-in via ``stage3_adaptive_prefetch_*``), and does not leak engines. For real
training it keeps stock's torch.compile exclusions and never synchronizes the device on the fetch
path. DeepSpeed's ``test_zero.py::TestZero3ParamPartitioningBase::test_prefetching[True]`` fails with
it by design (PR 9003; see :class:`ReferenceCoordinator`).
"""

from .coordinator import ReferenceCoordinator
from .install import install, is_installed, uninstall

__all__ = ["ReferenceCoordinator", "install", "uninstall", "is_installed"]
