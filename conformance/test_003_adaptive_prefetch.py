"""Family 003: the adaptive prefetch bucket, identical on every rank.

Spec: DeepSpeed PR 8431 (feature request issue 8193) and its review.  Opt-in keys
``stage3_adaptive_prefetch_bucket_size`` (bool), ``stage3_adaptive_prefetch_min_size`` and
``stage3_adaptive_prefetch_max_size``; ``stage3_prefetch_bucket_size`` is the starting value.  Every
few fetches a controller compares the time spent waiting for parameter all-gathers with the elapsed
time and grows the bucket when waits are a large share, shrinks it when they are small.  The review
found: ranks decided from their own clocks (different buckets → different prefetches → mismatched
collectives, a hang); samples taken while the trace was recorded pushed the bucket up; a starting
value outside the bounds was never clamped.  deepspeed 0.19.8 lacks the feature: its ZeRO config
rejects the keys, and every contract here reports ``unsupported: 003`` for it.

Observation surface (the smallest that works on any implementation; see fixtures/adaptive_prefetch.py):

* **config keys** at ``deepspeed.initialize``: all contracts.  Rejected as unknown keys → unsupported.
* **all-gathers issued**, per rank and step (output numel of each ``torch.distributed``
  all-gather, recorded by wrapping the function inside the rank before the first engine; deepspeed.comm
  captures it at ``init_distributed``; under ``stage3_use_all_reduce_for_fetch_params`` the
  all-reduces that fetch params instead, counted the same way).  Each is compared across ranks *before* it is issued, so a
  divergence fails with both sequences rather than hanging.  Needs nothing from the coordinator.
  003-a needs only the keys; the real-delay case of 003-b needs only the keys and this log.
* **optional** ``coordinator.prefetch_bucket_size`` (int: the size the next prefetch uses), read at each
  all-gather and each module's forward pre-hook, with the trace mode from the coordinator protocol
  (``is_record_trace``/``is_invalid_trace``).  Needed by 003-c, 003-d, 003-f; absent → unsupported.
* **optional injection** ``coordinator.adaptive.clock`` / ``.delay`` / ``.interval``: a fake clock
  (one fake second of compute per module forward, a chosen fake wait per all-gather wait) makes every
  decision deterministic, independent of the machine's speed.  Needed by the fake-clock case of
  003-b and by 003-c, 003-d, 003-e, 003-f; absent → unsupported.

Every scenario also compares, after each step, the buckets seen at every forward pre-hook and the
all-gather sequence across ranks (any contract fails on a rank divergence).
"""

import pytest
from pytest_zero3.fixtures import adaptive_prefetch as f
from pytest_zero3.fixtures import verdicts

LAYER = f.LAYER_NUMEL
BIG = 10**9


def _assert_each_rank(results, check, what: str = "adaptive prefetch") -> None:
    """``check(res)`` returns one rank's problems (a line, a list of lines, or None); every rank is read
    and every problem judged apart (:func:`verdicts.assert_clean`)."""

    def lines(res):
        found = check(res)
        return [found] if isinstance(found, str) else list(found or ())

    verdicts.assert_clean([lines(res) for res in results], what)


def _trajectory(result):
    """The bucket at each forward pre-hook, collapsed to its changes: ``[(step, module, value)]``."""
    out = []
    for step, where, _mode, value in result["fetch"]:
        if not out or out[-1][2] != value:
            out.append((step, where, value))
    return out


@pytest.mark.zero3_contract("003-a")
@pytest.mark.zero3_timeout(60)
def test_keys_accepted_and_validated(zero3_world):
    """Why: an unvalidated range (min > max) or a typo'd value silently gives a controller that can
    never settle, or one that is off; the user must learn it at initialize, from the key's name."""
    results = zero3_world.run(f.validation)

    def check(res):
        bad = []
        for case in res["cases"]:
            if case["error"] is None:
                bad.append(f"{case['overrides']} was accepted by deepspeed.initialize")
            elif case["key"] not in case["error"]:
                bad.append(f"{case['overrides']} failed without naming {case['key']}: {case['error'][:400]}")
        return bad

    _assert_each_rank(results, check, "invalid adaptive prefetch config")


@pytest.mark.zero3_contract("003-b")
@pytest.mark.zero3_timeout(45)
def test_same_bucket_on_every_rank_fake_clock(zero3_world):
    """Why: with rank-local decisions a slower rank grows its bucket while the others shrink theirs,
    they prefetch different parameters and issue mismatched all-gathers: the job hangs.

    The last rank's injected clock sees every all-gather wait as ten times a module's compute, the
    others' see none, with a decision every 2 fetches over 4 steps.  The scenario fails at the first
    all-gather (or fetch-point bucket) that differs, with every rank's sequence; the short timeout
    bounds a hang the comparison could not prevent.  Needs 2 ranks (unsupported on 1)."""
    results = zero3_world.run(f.slow_rank_fake_clock, 4, 2)
    _assert_each_rank(
        results,
        lambda res: (
            None
            if len(_trajectory(res)) > 1
            else (
                f"the bucket never moved although the last rank waited on every all-gather (trajectory "
                f"{_trajectory(res)}): the case proves nothing about agreement; see 003-f"
            )
        ),
    )


@pytest.mark.zero3_contract("003-b")
@pytest.mark.zero3_timeout(45)
def test_same_bucket_on_every_rank_real_delay(zero3_world):
    """Why: as above, through the implementation's own timers (no injection): the last rank sleeps
    2 ms in every Linear's forward, so the others wait on all-gathers that it joins late.  Whatever
    each rank measures, the buckets and all-gathers must agree (compared after every step, and before
    every all-gather).  Needs 2 ranks (unsupported on 1)."""
    results = zero3_world.run(f.slow_rank_real_delay, 6, 0.002)
    verdicts.assert_clean(
        [
            [f"issued other all-gathers than rank 0: {r['gathers']}; rank 0's: {results[0]['gathers']}"]
            if r["gathers"] != results[0]["gathers"]
            else []
            for r in results
        ],
        "ranks disagree on the all-gathers",
    )


@pytest.mark.zero3_contract("003-c")
@pytest.mark.parametrize("start", [5 * 10**7, 0], ids=["start-above-max", "start-below-min"])
@pytest.mark.zero3_timeout(60)
def test_bucket_within_bounds(zero3_world, start):
    """Why: the PR clamped only after a grow or shrink, so a start outside the bounds (DeepSpeed's
    default 5e7 with a small max) stayed there as long as waits were moderate: the memory cap the
    user set was ignored.

    Bounds [400, 544] elements (a 272-element layer, two layers); long waits for 2 steps, none for
    3 (decision every 2 fetches): the bucket must be clamped before the first step, reach max and
    min, and never leave the range."""
    low, high = 400, 2 * LAYER
    results = zero3_world.run(f.bounded, start, low, high, 2, 3, 2)

    def check(res):
        if not low <= res["start"] <= high:
            return f"starting bucket {res['start']} (stage3_prefetch_bucket_size={start}) is outside [{low}, {high}]"
        out = [(s, m, v) for s, m, _, v in res["fetch"] if not low <= v <= high]
        out += [(s, "all-gather", b) for s, g in enumerate(res["gathers"]) for _, b in g if not low <= b <= high]
        if out:
            return f"bucket outside [{low}, {high}] at (step, where, value): {out[:12]}"
        seen = {v for _, _, _, v in res["fetch"]}
        if not (high in seen and low in seen):
            return (
                f"the bucket did not reach both bounds (trajectory {_trajectory(res)}): long waits must drive it "
                f"to max {high}, then no waits to min {low}"
            )
        return None

    _assert_each_rank(results, check)


#: 003-d is checked by two scenarios (trace modes, and invalidation), both under one contract ID.
CONTRACT_003D = pytest.mark.zero3_contract("003-d")


@CONTRACT_003D
@pytest.mark.zero3_timeout(60)
def test_bucket_frozen_outside_complete_trace(zero3_world):
    """Why: recording and invalid passes never prefetch, so their waits say nothing about the bucket
    (every fetch is on demand); the PR counted them and drove the bucket up before prefetch ever ran.

    Long waits throughout, a decision every 2 fetches; the module order changes at step 2 (the trace
    is invalidated mid-step and re-recorded at step 3).  Between two forward pre-hooks the bucket may
    only change if the later one ran on a complete trace."""
    results = zero3_world.run(f.frozen_outside_complete_trace, 2)

    def check(res):
        moved = []
        prev = (None, None, "start", res["start"])
        for rec in res["fetch"]:
            if rec[3] != prev[3] and rec[2] != "complete":
                moved.append(f"step {rec[0]} {rec[1]} ({rec[2]} trace): {prev[3]} -> {rec[3]}")
            prev = rec
        if moved:
            return [f"bucket moved while the trace was not complete: {line}" for line in moved]
        modes = {m for _, _, m, _ in res["fetch"]}
        if not {"record", "invalid", "complete"} <= modes:
            return f"the scenario did not visit every trace mode: {modes}"
        if len(_trajectory(res)) <= 1:
            return (
                f"the bucket never moved on the complete trace despite long waits, so its staying put while "
                f"recording proves nothing: {_trajectory(res)}"
            )
        return None

    _assert_each_rank(results, check)


@CONTRACT_003D
@pytest.mark.zero3_timeout(60)
def test_samples_discarded_on_invalidation(zero3_world):
    """Why: samples of the old trace describe prefetches of a module order that no longer runs.

    A decision every 16 fetches.  Step 1 and the start of step 2 (before the changed order
    invalidates the trace) leave 12 samples in the open window: long waits in one run, none in a
    control run; from step 3 (re-record) on, neither has waits.  With the old samples dropped, the
    two runs' buckets are identical at every fetch; kept, the first decision on the new trace differs."""
    results = zero3_world.run(f.discard_on_invalidation, 16)

    def check(res):
        waited, control = res["waited"], res["control"]
        if len(_trajectory(control)) <= 1:
            return (
                f"no decision was taken on the re-recorded trace (trajectory {_trajectory(control)}), so nothing "
                "shows whether old samples were dropped"
            )
        differ = [(a[0], a[1], a[3], b[3]) for a, b in zip(waited["fetch"], control["fetch"]) if a[3] != b[3]]
        if differ:
            return (
                f"samples taken before the trace was invalidated changed later decisions: (step, module, bucket "
                f"after long waits before invalidation, bucket without them) {differ[:6]}; trajectories "
                f"{_trajectory(waited)} vs {_trajectory(control)}"
            )
        return None

    _assert_each_rank(results, check)


@pytest.mark.zero3_contract("003-e")
@pytest.mark.zero3_timeout(60)
def test_adaptation_changes_no_number(zero3_world):
    """Why: the bucket only decides when a parameter is gathered, never what it holds; any numeric
    difference means a parameter was used stale or before its all-gather completed.

    8 steps with a static one-layer bucket, then the same 8 steps adaptive from the same start
    (long waits for 3 steps, then none; a decision every 2 fetches).  Losses and gathered final
    weights must be equal bit for bit, and the all-gathers must show that the bucket did move (so
    it needs 2 ranks: a 1-rank world issues no all-gathers; unsupported there)."""
    results = zero3_world.run(f.on_off_identical, 8, 3, 2)

    def check(runs):
        static, adaptive = runs["static"], runs["adaptive"]
        if adaptive["gathers"] == static["gathers"]:
            return (
                f"adaptive run issued the same all-gathers as the static one: the bucket never moved "
                f"(trajectory {_trajectory(adaptive)})"
            )
        if adaptive["losses"] != static["losses"]:
            return f"losses differ with adaptation on:\n  off {static['losses']}\n  on  {adaptive['losses']}"
        diff = {
            n: float((adaptive["state"][n] - t).abs().max())
            for n, t in static["state"].items()
            if not bool((adaptive["state"][n] == t).all())
        }
        return f"final weights differ with adaptation on (max |diff| per param): {diff}" if diff else None

    _assert_each_rank(results, check)


@pytest.mark.zero3_contract("003-f")
@pytest.mark.zero3_timeout(60)
def test_controller_adapts(zero3_world):
    """Why: a controller that never moves (or moves the wrong way) is the static bucket with extra
    collectives.  Long injected waits for 2 steps, then none for 3 (a decision every 2 fetches),
    from a one-layer start in [136, 1e9]: every change in the wait phase is a growth, every change
    after is a shrink, and the grown bucket is applied (one all-gather then carries several layers;
    so it needs 2 ranks: a 1-rank world issues no all-gathers; unsupported there)."""
    low = LAYER // 2
    results = zero3_world.run(f.adapts, LAYER, low, BIG, 2, 3, 2)

    def check(res):
        traj = _trajectory(res)
        grow = [v for s, _, v in traj if s < 2]
        shrink = [v for s, _, v in traj if s >= 2]
        if not (len(grow) > 1 and grow == sorted(set(grow))):
            return f"bucket did not grow (only) under long waits: {traj}"
        peak = grow[-1]
        if not (len(shrink) > 1 and shrink == sorted(set(shrink), reverse=True) and shrink[-1] < peak):
            return f"bucket did not shrink (only) without waits: {traj}"
        if min(shrink) < low:
            return f"bucket went below min {low}: {traj}"
        if not [s for s, g in enumerate(res["gathers"][:2]) if any(n > LAYER for n, _ in g)]:
            return (
                f"no all-gather larger than one layer ({LAYER}) while the bucket grew to {peak}: the "
                f"reported bucket is not the one applied; all-gathers {res['gathers'][:2]}"
            )
        return None

    _assert_each_rank(results, check)


@pytest.mark.zero3_contract("003-g")
@pytest.mark.zero3_timeout(180)
def test_controller_sees_device_side_waits(zero3_world):
    """Why: on an asynchronous device (CUDA) a wait for an all-gather returns on the host at once and
    blocks only the compute stream; a controller timing it with host timers measures nothing and
    shrinks the bucket while the GPU stalls.  Every other 003 contract drives time through an
    injected clock, so this is the one that judges the implementation's own timing.

    6 steps, each all-gather preceded by 20 ms of GPU sleep on its stream, compute of a few
    microseconds: waits are nearly all of the time, so the bucket must grow above its one-layer
    start.  Needs CUDA and 2 ranks (unsupported on the CPU and on 1 rank, with the reason)."""
    results = zero3_world.run(f.device_delayed, 6, 20.0)

    def check(res):
        traj = _trajectory(res)
        if max(v for _, _, v in traj) > res["start"]:
            return None
        return (
            f"the bucket never grew above its start {res['start']} although every all-gather waited 20 ms on the "
            f"device (trajectory {traj}): the controller does not see device-side waits (host timers?)"
        )

    _assert_each_rank(results, check)
