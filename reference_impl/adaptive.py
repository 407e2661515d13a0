"""Adaptive prefetch bucket: resize ``stage3_prefetch_bucket_size`` from measured all-gather stalls.

A bucket that is too small leaves compute waiting on all-gathers; one that is too large holds memory
for parameters needed only much later. The controller compares the time the compute stream spent
blocked on all-gathers with the elapsed time, and resizes the bucket from their ratio: grow when
waits are a large share, shrink when they are a small one, always within ``[min_size, max_size]``.

Every rank must prefetch exactly the same parameters at every fetch, otherwise the all-gathers they
issue differ and the job hangs. So:

* **One decision point per pass, fixed in the trace.** The coordinator calls :meth:`start_pass` at
  every ``reset_step`` (with the length of the complete trace, or ``None``) and :meth:`fetch_done`
  after each fetch on a complete trace. The decision point is trace step
  ``min(interval, len(trace)) - 1`` of every pass, which every rank replays identically.
* **The window restarts at ``reset_step``.** When the trace has at least ``interval`` fetches, the
  window is the first ``interval`` fetches of the pass, from ``reset_step`` to the decision point:
  one decision per pass. A shorter trace accumulates whole passes (``reset_step`` to its last
  fetch) until they hold ``interval`` fetches, and decides at the last fetch of that pass. Either
  way optimizer, data loading and anything else between passes never dilute the ratio.
* **The group decides.** The ratio is the maximum over the data-parallel group (one all-reduce,
  read once, at the decision point): every rank computes the same new size.
* **No samples outside a complete trace.** Recording and invalid passes never prefetch, so their
  waits say nothing about the bucket; :meth:`reset` (trace invalidated or re-recorded) drops the
  window.

Timing never stalls the device. Where the accelerator is synchronous with the host (CPU:
``use_host_timers()``) segments and waits are host times (``time.perf_counter``, or an injected
``clock``). Elsewhere they are device events recorded on the compute stream, never synchronized: at
the decision point only segments whose end event has completed (``query()``) are read; the others
(typically the window that ends right there) are read at the next decision point, a pass later. A
rank with nothing readable contributes "no data" (-1) to the group maximum; when no rank has data
the size stays. The only host read of a device value is the group maximum, once per decision. ``delay`` is an optional callable run inside every timed wait, to
simulate slow all-gathers.
"""

import math
import time
from contextlib import contextmanager
from typing import Callable, Optional

import torch
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

GROW_ABOVE = 0.15  # wait share of the window above which the bucket grows
SHRINK_BELOW = 0.05  # wait share below which it shrinks
GROW_FACTOR = 1.25
SHRINK_FACTOR = 0.9
GROW_QUANTUM = 1 << 20  # smallest growth step in elements, so a tiny or zero bucket can recover


class _Segment:
    """A stretch of one pass: its start and end marks (host seconds or device events) and the waits
    inside it (a host sum, or a list of event pairs)."""

    __slots__ = ("start", "end", "waits", "host_wait")

    def __init__(self, start):
        self.start, self.end, self.waits, self.host_wait = start, None, [], 0.0


class AdaptivePrefetchBucket:
    """Controller owning the prefetch bucket size of one coordinator.

    The coordinator calls :meth:`start_pass` at each ``reset_step``, brackets
    each blocking wait with :meth:`measure_wait` and calls :meth:`fetch_done` once per fetch on a
    complete trace; :attr:`size` is what the next prefetch uses. :meth:`reset` drops the window.
    """

    def __init__(
        self,
        initial: int,
        min_size: int,
        max_size: int,
        group=None,
        interval: int = 10,
        clock: Optional[Callable[[], float]] = None,
        delay: Optional[Callable[[], None]] = None,
    ):
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
        self._trace_len: Optional[int] = None
        self._pass_fetches = 0
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

    @property
    def decision_step(self) -> int:
        """The trace step (0-based fetch of a pass) at which a decision may be taken."""
        if self._trace_len is None:
            return self.interval - 1
        return min(self.interval, self._trace_len) - 1

    def reset(self) -> None:
        """Drop every sample of the window (trace invalidated, re-recorded, or clock swapped)."""
        self._fetches = 0
        self._closed: list[_Segment] = []
        self._open: Optional[_Segment] = None

    def start_pass(self, trace_len: Optional[int]) -> None:
        """``reset_step``: a pass over a complete trace of ``trace_len`` fetches (``None``: recording
        or invalid) starts here; so does the window, unless a short trace is accumulating passes."""
        self._trace_len = trace_len
        self._pass_fetches = 0
        self._open = None
        if trace_len is not None:
            if self.interval <= trace_len:
                self._fetches = 0
            self._open = _Segment(self._mark())

    def _mark(self):
        if self._use_events:
            event = get_accelerator().Event(enable_timing=True)
            event.record()
            return event
        return self._clock()

    @contextmanager
    def measure_wait(self):
        """Time the enclosed blocking wait for all-gathers (and run the injected delay inside it).
        Waits after this pass's decision are not sampled: the window restarts at ``reset_step``."""
        if self._open is None and self._trace_len is None:
            self._open = _Segment(self._mark())
        segment = self._open
        start = self._mark() if segment is not None else None
        try:
            if self.delay is not None:
                self.delay()
            yield
        finally:
            if segment is not None:
                end = self._mark()
                if self._use_events:
                    segment.waits.append((start, end))
                else:
                    segment.host_wait += end - start

    def fetch_done(self) -> None:
        """Count one fetch of a complete trace; decide at the pass's decision point."""
        self._fetches += 1
        index = self._pass_fetches
        self._pass_fetches += 1
        if index == self.decision_step and self._fetches >= self.interval:
            self._close_segment()
            self._decide(self._window_ratio())
        elif self._trace_len is not None and index == self._trace_len - 1:
            self._close_segment()  # a short trace: this pass joins the window

    def _close_segment(self) -> None:
        if self._open is not None:
            self._open.end = self._mark()
            self._closed.append(self._open)
            self._open = None

    def _window_ratio(self) -> float:
        """Wait share of the closed segments that can be read without waiting for the device, or
        -1 when none can."""
        waited = window = 0.0
        pending = []
        for segment in self._closed:
            if self._use_events:
                if not segment.end.query():  # still running on the device: next decision
                    pending.append(segment)
                    continue
                window += segment.start.elapsed_time(segment.end) / 1e3
                waited += sum(s.elapsed_time(e) for s, e in segment.waits) / 1e3
            else:
                window += segment.end - segment.start
                waited += segment.host_wait
        read = len(self._closed) - len(pending)
        self._closed = pending
        if not read:
            return -1.0
        return waited / window if window > 0 else 0.0

    def _decide(self, local_ratio: float) -> None:
        ratio = self._group_max(local_ratio)
        if ratio < 0:  # no rank could read a finished window yet
            proposed = self._size
        elif ratio > GROW_ABOVE:
            proposed = max(math.ceil(self._size * GROW_FACTOR), self._size + GROW_QUANTUM)
        elif ratio < SHRINK_BELOW:
            proposed = int(self._size * SHRINK_FACTOR)
        else:
            proposed = self._size
        self._size = min(self.max_size, max(self.min_size, proposed))
        self.last_ratio = ratio
        self.decisions += 1
        pending = self._closed
        self.reset()
        self._closed = pending  # segments still on the device belong to the next window

    def _group_max(self, ratio: float) -> float:
        """All ranks adopt the worst stall in the group, so all compute the same new size."""
        if not dist.is_initialized() or dist.get_world_size(group=self.group) == 1:
            return ratio
        value = torch.tensor([ratio], dtype=torch.float64, device=get_accelerator().current_device_name())
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return float(value.item())  # the one host read, at the decision point
