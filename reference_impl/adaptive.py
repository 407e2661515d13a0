"""Adaptive prefetch bucket: resize ``stage3_prefetch_bucket_size`` from measured all-gather stalls.

A bucket that is too small leaves compute waiting on all-gathers; one that is too large holds memory
for parameters needed only much later. The controller measures, over a window of ``interval``
fetches, the time the compute stream spent blocked on all-gathers and the elapsed time of the whole
window, and resizes the bucket from their ratio: grow when waits are a large share, shrink when they
are a small one, always within ``[min_size, max_size]``.

Every rank must prefetch exactly the same parameters at every fetch, otherwise the all-gathers they
issue differ and the job hangs. Decisions are therefore taken only at a deterministic point (every
``interval``-th fetch on a complete trace, which every rank replays identically) and only from the
maximum ratio over the data-parallel group (one all-reduce per decision). No samples are taken
while the trace is recorded or invalid: those passes never prefetch, so their waits say nothing
about the bucket; invalidation drops the current window.

Timing: with an injected ``clock`` (a zero-argument callable returning seconds) all timing is host
time from that clock, which makes the controller deterministic for tests. Otherwise accelerators
with device events time the waits on the compute stream with events, resolved once per decision
(no synchronize per fetch); host-timed accelerators (CPU) use ``time.perf_counter``. ``delay`` is
an optional callable run inside every timed wait, to simulate slow all-gathers.
"""

import math
import time
from contextlib import contextmanager
from typing import Callable, List, Optional, Tuple

import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

GROW_ABOVE = 0.15  # wait share of the window above which the bucket grows
SHRINK_BELOW = 0.05  # wait share below which it shrinks
GROW_FACTOR = 1.25
SHRINK_FACTOR = 0.9
GROW_QUANTUM = 1 << 20  # smallest growth step in elements, so a tiny or zero bucket can recover


class AdaptivePrefetchBucket:
    """Controller owning the prefetch bucket size of one coordinator.

    The coordinator brackets each blocking wait with :meth:`measure_wait` and calls
    :meth:`fetch_done` once per fetch on a complete trace; :attr:`size` is what the next prefetch
    uses. :meth:`reset` drops the current measurement window.
    """

    def __init__(self,
                 initial: int,
                 min_size: int,
                 max_size: int,
                 group=None,
                 interval: int = 10,
                 clock: Optional[Callable[[], float]] = None,
                 delay: Optional[Callable[[], None]] = None):
        if not 0 <= min_size <= max_size:
            raise ValueError(f"adaptive prefetch needs 0 <= min_size <= max_size, got [{min_size}, {max_size}]")
        if interval < 1:
            raise ValueError(f"adaptive prefetch interval must be >= 1, got {interval}")
        self.min_size = int(min_size)
        self.max_size = int(max_size)
        self._size = min(self.max_size, max(self.min_size, int(initial)))
        self.group = group
        self.interval = interval
        self.delay = delay
        self.last_ratio: Optional[float] = None
        self.decisions = 0
        accelerator = get_accelerator()
        self._use_events = clock is None and not accelerator.use_host_timers()
        self._clock = clock or time.perf_counter
        self.reset()

    @property
    def size(self) -> int:
        return self._size

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        """Injecting a clock switches to host timing with it and starts a fresh window."""
        self._clock = clock
        self._use_events = False
        self.reset()

    def reset(self) -> None:
        """Drop every sample of the current window (trace invalidated, re-recorded, or clock swapped)."""
        self._fetches = 0
        self._window_start = None
        self._host_wait = 0.0
        self._event_waits: List[Tuple[object, object]] = []

    def _mark(self):
        if self._use_events:
            event = get_accelerator().Event(enable_timing=True)
            event.record()
            return event
        return self._clock()

    @contextmanager
    def measure_wait(self):
        """Time the enclosed blocking wait for all-gathers (and run the injected delay inside it)."""
        start = self._mark()
        if self._window_start is None:
            self._window_start = start
        try:
            if self.delay is not None:
                self.delay()
            yield
        finally:
            end = self._mark()
            if self._use_events:
                self._event_waits.append((start, end))
            else:
                self._host_wait += end - start

    def fetch_done(self) -> None:
        """Count one fetch of a complete trace; every ``interval``-th one takes a group decision."""
        self._fetches += 1
        if self._fetches % self.interval == 0:
            end = self._mark()
            self._decide(self._local_ratio(end))
            self._window_start = end  # the next window starts where this one ended

    def _local_ratio(self, end) -> float:
        if self._use_events:
            end.synchronize()  # once per decision, never per fetch
            waited = sum(s.elapsed_time(e) for s, e in self._event_waits) / 1e3
            window = self._window_start.elapsed_time(end) / 1e3
        else:
            waited, window = self._host_wait, end - self._window_start
        return waited / window if window > 0 else 0.0

    def _decide(self, local_ratio: float) -> None:
        ratio = self._group_max(local_ratio)
        if ratio > GROW_ABOVE:
            proposed = max(math.ceil(self._size * GROW_FACTOR), self._size + GROW_QUANTUM)
        elif ratio < SHRINK_BELOW:
            proposed = int(self._size * SHRINK_FACTOR)
        else:
            proposed = self._size
        self._size = min(self.max_size, max(self.min_size, proposed))
        self.last_ratio = ratio
        self.decisions += 1
        self.reset()

    def _group_max(self, ratio: float) -> float:
        """All ranks adopt the worst stall in the group, so all compute the same new size."""
        if not dist.is_initialized() or dist.get_world_size(group=self.group) == 1:
            return ratio
        value = torch.tensor([ratio], dtype=torch.float64, device=get_accelerator().current_device_name())
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return float(value.item())
