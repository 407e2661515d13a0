"""A coordinator class for the SPEC-form tests: stock deepspeed's coordinator under another name."""

from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator


class RenamedCoordinator(PartitionedParameterCoordinator):
    """Behaves exactly like DeepSpeed's; only its name tells that the harness patched it in."""
