"""Known-bad coordinator: the adaptive controller times all-gather waits with host timers on CUDA.

On an asynchronous device a wait for an all-gather returns on the host at once (it only makes the
compute stream wait), so host timers measure no waiting while the GPU stalls: the bucket shrinks
when it should grow.  The reference times waits with device events on such devices; this subclass
keeps everything else and forces host timing.  Contract 003-g must flag it (on CUDA; on the CPU the
contract is unsupported, and host timing is right there).
"""

from pytest_zero3.reference_impl.coordinator import ReferenceCoordinator


class AdaptiveHostTimersCoordinator(ReferenceCoordinator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.adaptive is not None:
            self.adaptive._use_events = False  # the bug: host timers on an asynchronous device
