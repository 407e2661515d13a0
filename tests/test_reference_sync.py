"""The reference's adaptive prefetch never stalls the host on the device on its fetch path.

On a GPU every ``Event.synchronize()``, ``accelerator.synchronize()`` or ``tensor.item()`` in a
module's fetch hook is a host stall (and an ``.item()`` of an all-reduced value a data-parallel
barrier) inside forward/backward: the stall adaptive prefetch exists to remove.  On CPU the same
calls are counted through patched hooks: the accelerator is made to look asynchronous (no host
timers) and its ``Event`` is a counting stand-in, so the controller takes its device-event path.

Bound: no synchronize anywhere in the coordinator; a host read (the group maximum of the wait
share) only at the one decision fetch per pass, at a fixed trace step, identical on every rank;
every other fetch, release and ``reset_step``, 0 (except the ``reset_step`` that closes a recorded
pass: it checks the trace is the same on every rank, as stock does, once per re-record).

Cost: one 2-rank world, 5 steps of a 4-layer MLP, about 10 s on the 2-core CI machine.
"""

import time

import torch
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.adaptive_prefetch import LAYER_NUMEL, adaptive_config
from pytest_zero3.fixtures.config import MICRO_BATCH
from pytest_zero3.fixtures.models import MLP, WIDTH

from pytest_zero3 import scenario

STEPS = 5
INTERVAL = 2


class Counts:
    def __init__(self):
        self.synchronize = self.item = 0

    def total(self):
        return self.synchronize + self.item


class CountingEvent:
    """Stand-in for a device event: records host time; ``query()`` is always done (CPU)."""

    counts = None

    def __init__(self, enable_timing=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def query(self):
        return True

    def synchronize(self):
        CountingEvent.counts.synchronize += 1

    def elapsed_time(self, end):
        return (end.time - self.time) * 1e3


def host_syncs_per_fetch() -> dict:
    """Per fetch on a complete trace: ``(pass, index in pass, host syncs, decision taken)``."""
    from deepspeed.accelerator import get_accelerator

    from pytest_zero3 import reference_impl

    reference_impl.install()
    counts = Counts()
    CountingEvent.counts = counts
    accelerator = get_accelerator()
    accelerator.use_host_timers = lambda: False
    type(accelerator).Event = property(lambda self: CountingEvent)  # a property on the CPU accelerator
    accelerator.synchronize = lambda *a, **k: setattr(counts, "synchronize", counts.synchronize + 1)
    item = torch.Tensor.item

    def counted_item(self):
        counts.item += 1
        return item(self)

    engine = eng.build(lambda: MLP(4), adaptive_config(LAYER_NUMEL, 0, 10**9))
    coord = eng.coordinator(engine)
    coord.adaptive.interval = INTERVAL
    fetch, release, reset = coord.fetch_sub_module, coord.release_sub_module, coord.reset_step
    records, outside, state, inside = [], [], {"pass": -1, "index": 0}, {"synchronize": 0}

    def counted(call, where):
        def run(*args, **kwargs):
            before, waits, decisions = counts.total(), counts.synchronize, coord.adaptive.decisions
            torch.Tensor.item = counted_item
            try:
                return call(*args, **kwargs)
            finally:
                torch.Tensor.item = item
                syncs = counts.total() - before
                inside["synchronize"] += counts.synchronize - waits
                if where == "fetch" and coord.is_complete_trace():
                    records.append((state["pass"], state["index"], syncs, coord.adaptive.decisions > decisions))
                    state["index"] += 1
                elif syncs:
                    outside.append((state["pass"], where, syncs))

        return run

    def counted_reset():
        # closing a recorded pass checks the trace across ranks (as stock does): once per re-record
        counted(reset, "closing a recorded trace" if coord.is_record_trace() else "reset_step")()
        state["pass"] += 1
        state["index"] = 0

    coord.fetch_sub_module = counted(fetch, "fetch")
    coord.release_sub_module = counted(release, "release")
    coord.reset_step = counted_reset
    for step in range(STEPS):
        x, _ = eng.batch(step, (MICRO_BATCH, WIDTH), scenario.rank(), scenario.world_size())
        eng.train_step(engine, x)
    decisions = coord.adaptive.decisions
    engine.destroy()
    return dict(records=records, outside=outside, synchronize=inside["synchronize"], decisions=decisions)


def test_no_host_sync_on_the_fetch_path(zero3_world):
    """Why: the old controller synchronized the device and read an all-reduced value every 10
    fetches: tens of stalls and barriers per step on a GPU (issue 14)."""
    results = zero3_world.run(host_syncs_per_fetch)
    for rank, res in enumerate(results):
        assert res["decisions"] >= STEPS - 2, f"rank {rank}: too few decisions to prove anything: {res['decisions']}"
        assert res["synchronize"] == 0, f"rank {rank}: {res['synchronize']} device synchronizes in the coordinator"
        outside = [r for r in res["outside"] if r[1] != "closing a recorded trace"]
        assert not outside, f"rank {rank}: host syncs outside fetches (pass, where, n): {outside}"
        syncing = [r for r in res["records"] if r[2]]
        wrong = [r for r in syncing if not r[3] or r[2] > 1 or r[1] != INTERVAL - 1]
        assert not wrong, (
            f"rank {rank}: host syncs on fetches that are not the pass's one decision point "
            f"(trace step {INTERVAL - 1}); (pass, fetch, syncs, decided): {wrong}"
        )
        per_pass = {}
        for r in syncing:
            per_pass[r[0]] = per_pass.get(r[0], 0) + r[2]
        assert all(n <= 1 for n in per_pass.values()), f"rank {rank}: host syncs per pass {per_pass}"
    assert results[0]["records"] == results[1]["records"], "ranks decided at different fetches"
