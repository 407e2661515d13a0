"""Baseline contracts (family ``base``): what every correct ZeRO-3 parameter coordinator does.

A coordinator only decides *when* parameters are gathered and released; it must never change a
number.  So training a model with ZeRO-3 on 2 ranks must reproduce a plain single-process torch run
of the same model, seed and global batches (the twin, ``pytest_zero3.fixtures.twin``), and after every
step the engine must be back to its resting state: non-persistent params partitioned, persistent
params gathered, no module claiming a param.

Tolerance (``pytest_zero3.fixtures.parity.RTOL``/``ATOL`` = 1e-5 / 1e-6, elementwise, on the rank-averaged
losses and on every final gathered weight, 10 steps of AdamW lr 1e-2): ZeRO-3 computes two
half-batch gradients and averages them where plain torch computes one full-batch gradient, so the
two differ by fp32 rounding, which Adam's normalisation carries into the weights.  Measured on
deepspeed 0.19.8 and on the reference: losses differ by at most 2e-8 (relative 2e-7), weights by at
most 5e-7 (relative 1e-6 for the 131072-element table, 1e-5 for small weights near zero, always
under the bound).  A param used stale, half-gathered or reduced twice moves a weight by about the
learning rate (1e-2) within a step.

The models (``pytest_zero3.fixtures.models.extra``) are tiny and built from code; every scenario runs 10-12
training steps and takes about a second per engine on a 2-core CPU box.
"""

import pytest
from pytest_zero3.fixtures import parity as fb
from pytest_zero3.fixtures import verdicts
from pytest_zero3.fixtures.models import linear_numel
from pytest_zero3.fixtures.models.extra import FIRST_BLOCK_LEAF_THRESHOLD

PREFETCH_ONE_LAYER = {"stage3_prefetch_bucket_size": fb.ONE_LAYER_BUCKET}
PREFETCH_DEFAULT = {"stage3_prefetch_bucket_size": fb.DEFAULT_BUCKET}


def _runs(per_rank):
    """Each rank's runs as a list (a scenario of one run returns its dict)."""
    return [rank if isinstance(rank, list) else [rank] for rank in per_rank]


def _assert_parity(per_rank, labels, keep=None):
    """Every rank compared its own training with the twin: each rank's parity lines, merged by
    :func:`verdicts.assert_clean` (``keep(run)``: the runs judged; default all)."""
    lines = [
        [
            line
            for run, label in zip(runs, labels)
            if keep is None or keep(run)
            for line in fb.parity_problems(run, label)
        ]
        for runs in _runs(per_rank)
    ]
    verdicts.assert_clean(lines, "ZeRO-3 training differs from plain torch")


@pytest.mark.zero3_contract("base-a")
def test_mlp_parity_prefetch_off(zero3_world):
    """The simplest possible run: every param fetched on demand and released after use.

    Persistence threshold 0, prefetch bucket 0: each Linear is gathered in its forward pre-hook and
    again in backward.  Parity here is the floor every other contract builds on.
    """
    _assert_parity(zero3_world.run(fb.parity, "mlp"), ["MLP, prefetch off"])


@pytest.mark.zero3_contract("base-b")
def test_mlp_parity_prefetch_on(zero3_world):
    """Prefetch gathers params ahead along the recorded trace, from step 1 on.

    A prefetched param must be the current partition (not the one from before the last optimizer
    step) and must be waited on before use.  Two buckets: about one layer ahead (the coordinator
    pops params from its queue and stops) and DeepSpeed's default (the whole model ahead).
    """
    per_rank = zero3_world.run(
        fb.parity_many, [("mlp", {"zero": PREFETCH_ONE_LAYER}), ("mlp", {"zero": PREFETCH_DEFAULT})]
    )
    _assert_parity(per_rank, ["MLP, prefetch bucket 300", "MLP, prefetch bucket 5e7"])


@pytest.mark.zero3_contract("base-c")
def test_tied_weights_parity(zero3_world):
    """``dec.weight is enc.weight`` and ``mid`` runs twice per forward (``pytest_zero3.fixtures.models.extra.TiedMLP``).

    One Parameter with two consumer modules, and one module appearing twice in the trace: a
    coordinator that releases a param when *one* consumer finishes, or prefetches it again while it
    is still gathered, breaks the forward or the gradient (which must be reduced once).
    """
    per_rank = zero3_world.run(fb.parity_many, [("tied", {}), ("tied", {"zero": PREFETCH_DEFAULT})])
    _assert_parity(per_rank, ["tied weights, prefetch off", "tied weights, prefetch bucket 5e7"])


@pytest.mark.zero3_contract("base-d")
def test_z3_leaf_module_parity(zero3_world):
    """``Experts`` calls its two children in a per-sample, data-dependent order (``models_extra.LeafModel``).

    Without the leaf flag the two ranks would record different module sequences.  With it, the
    coordinator fetches every param under the leaf when the leaf starts and releases them when it
    ends: while expert ``a`` runs, expert ``b``'s params must already be gathered.
    """
    per_rank = zero3_world.run(fb.leaf_parity, [{}, {"zero": PREFETCH_ONE_LAYER}])
    lines = [
        [
            f"z3 leaf module, {label}: when experts.a started its forward, these params of the leaf were not "
            f"gathered (the leaf must be fetched as a whole): {run['leaf_not_gathered']}"
            for run, label in zip(runs, ["prefetch off", "prefetch bucket 300"])
            if run["leaf_not_gathered"]
        ]
        for runs in per_rank
    ]
    verdicts.assert_clean(lines, "z3 leaf module not gathered as a whole")
    _assert_parity(per_rank, ["z3 leaf module, prefetch off", "z3 leaf module, prefetch bucket 300"])


@pytest.mark.zero3_contract("base-e")
def test_default_persistence(zero3_world):
    """``stage3_param_persistence_threshold`` left at DeepSpeed's default (1e5 elements).

    ``TableMLP``'s 131072-element embedding table exceeds it and must be partitioned after every
    step; its Linear layers are under it, so DeepSpeed marks them ``ds_persist``: they are gathered
    once and must stay gathered (all their elements present) across every forward, backward and
    optimizer step, and the optimizer's updates must reach them.
    """
    per_rank = zero3_world.run(fb.parity, "table", default_persistence=True)
    bad = [
        [
            f"{'during' if key == 'persistence_within' else 'after'} step {s}: {v}"
            for key in ("persistence_within", "persistence", "lifecycle")
            for s, lines in enumerate(run[key])
            for v in lines
        ]
        + (
            []
            if run["partitioned"] == ["table.weight"] and len(run["persistent"]) == 4
            else [
                "scenario precondition: expected only table.weight (131072 elements) above the default threshold, "
                f"got persistent={run['persistent']} partitioned={run['partitioned']}"
            ]
        )
        for run in per_rank
    ]
    verdicts.assert_clean(bad, "persistent params must stay resident and the others be released")
    _assert_parity(per_rank, ["TableMLP, default persistence threshold"])


@pytest.mark.zero3_contract("base-f")
def test_released_after_every_step(zero3_world):
    """Read after ``engine.step()`` in configurations that stress release.

    Prefetch at the default bucket (params gathered far ahead), tied weights (two consumers), a z3
    leaf, non-reentrant activation checkpointing over a frozen layer (backward re-runs the
    forward, and DeepSpeed attributes frozen params to the recomputing module through
    ``ds_recompute_parameters``), and a frozen first layer gathered together with trainable ones
    (under hpZ the frozen one keeps its secondary shard across the step, the others do not).  Anything still gathered or claimed after the step is memory
    ZeRO-3 promised to free, and a claim blocks the next ``partition()``.
    """
    runs = [
        ("mlp", {"zero": PREFETCH_DEFAULT}),
        ("tied", {"zero": PREFETCH_DEFAULT}),
        ("leaf", {"zero": PREFETCH_ONE_LAYER}),
        ("ckpt", {}),
        ("ckpt", {"zero": PREFETCH_DEFAULT}),
        ("frozen_first", {"zero": PREFETCH_DEFAULT}),
    ]
    per_rank = zero3_world.run(fb.parity_many, runs)
    labels = [f"{m}, zero={kw.get('zero', {})}" for m, kw in runs]
    _assert_nothing_left_after_step(per_rank, labels)
    verdicts.assert_clean(
        [
            [
                f"{label}: the checkpointed block was never recomputed"
                for result, label, (model, _) in zip(rank_runs, labels, runs)
                if model == "ckpt" and not result["recomputed_forwards"] > 0
            ]
            for rank_runs in per_rank
        ],
        "scenario precondition",
    )


@pytest.mark.zero3_contract("base-g")
def test_module_order_change(zero3_world):
    """``ReorderableMLP`` runs layers 0,1,2,3 for 5 steps, then 3,2,1,0 for 7 (plain torch does the same).

    The recorded trace no longer describes the forward: a coordinator must notice, stop trusting it
    (parity), record the new order and prefetch along it again.  Prefetch (bucket about one layer)
    is observed at each layer's forward start: the next layer's params must be gathered or in
    flight in steps 2-4 (old order) and in the last 3 steps (new order, after re-recording).
    """
    orders = [(0, 1, 2, 3)] * 5 + [(3, 2, 1, 0)] * 7
    per_rank = zero3_world.run(
        fb.parity, "reorder", zero=PREFETCH_ONE_LAYER, steps=len(orders), orders=orders, watch_prefetch=True
    )
    checked = {2: "old order", 3: "old order", 4: "old order", 9: "new order", 10: "new order", 11: "new order"}
    missed = [
        [
            f"step {s} ({what}, order {orders[s]}): layer {nxt} not gathered or in flight when layer {cur} started"
            for s, what in checked.items()
            for cur, nxt, fetched in result["prefetch"][s]
            if not fetched
        ]
        for result in per_rank
    ]
    verdicts.assert_clean(missed, "prefetch does not follow the recorded module order (the trace was not re-recorded?)")
    _assert_parity(per_rank, ["module order changed at step 5"])


@pytest.mark.zero3_contract("base-h")
def test_eval_forward(zero3_world):
    """Train 3 steps, evaluate, repeat 3 times (prefetch off).

    Eval forwards have no backward, so the coordinator sees a different module sequence than the
    recorded training trace, and nothing (no backward, no optimizer step) releases params after
    them but the coordinator itself.  Each eval forward (twice in eval mode, once in train mode
    without grad) must equal the plain model trained as many steps, and training afterwards must
    still match plain torch.
    """
    per_rank = zero3_world.run(fb.eval_forwards, zero={"stage3_max_reuse_distance": 0})
    verdicts.assert_clean([_eval_problems(result) for result in per_rank], "eval forwards interleaved with training")


def _eval_problems(result: dict) -> list[str]:
    """One rank's base-h lines: eval outputs against the twin's, state left after each phase, parity."""
    rtol, atol = result["tolerance"]
    problems = [
        f"after {e['after_steps']} steps, {c['name']}: max |diff| {c['max_abs']:.3g} vs the twin's model "
        f"(worst element {c['worst_index']}: {c['got']!r} vs {c['want']!r}; bound atol {atol:g} + "
        f"rtol {rtol:g}*|twin|)"
        for e in result["evals"]
        for c in e["eval"] + [e["train_mode"]]
        if not c["within"]
    ]
    problems += [
        f"after eval forwards following step {e['after_steps']}: {v}"
        for e, lines in zip(result["evals"], result["lifecycle"])
        for v in lines
    ]
    problems += [f"after step {s}: {v}" for s, lines in enumerate(result["lifecycle_after_steps"]) for v in lines]
    problems += fb.parity_problems({**result, "missing": [], "weights": []}, "training interleaved with eval forwards")
    return problems


@pytest.mark.zero3_contract("base-i")
def test_gather_after_eval_forward(zero3_world):
    """Train 3 steps with prefetch on (two configs, below), then a no-grad forward in eval mode and one in train mode, each followed by ``GatheredParameters`` over every param.

    A forward without backward ends with prefetches aimed at backward uses still in flight; nothing
    but the next forward's ``reset_step`` would wait on them.  A param left INFLIGHT cannot be
    partitioned, so the user's gather fails ("Cannot partition a param in flight") in the middle of
    their evaluation loop.  The coordinator must leave none in flight when a no-grad forward ends, and
    the gathered weights must be the trained ones.
    """
    per_rank = [[] for _ in range(zero3_world.size)]
    for zero in EVAL_GATHER_CONFIGS:
        runs = zero3_world.run(fb.gather_after_eval, zero=zero)
        for rank, run in enumerate(runs):
            for row in run:
                where = f"{zero}: after the {row['after']}"
                if row["inflight"]:
                    per_rank[rank].append(f"{where}: params left INFLIGHT: {row['inflight']}")
                if row["error"]:
                    per_rank[rank].append(f"{where}: GatheredParameters raised {row['error']}")
                weights = {"losses": [], "missing": [], "weights": row.get("weights", [])}
                if "tolerance" in row:  # the rank's dtype chose it (fixtures/profiles.py)
                    weights["tolerance"] = tuple(row["tolerance"])
                per_rank[rank] += fb.parity_problems(weights, f"{zero}: weights gathered after the {row['after']}")
    verdicts.assert_clean(per_rank, "gathering after a no-grad forward")


#: base-i's configs: reuse distance 0 with a one-layer bucket, and a two-layer window with a bucket just
#: under one layer (on 0.19.8 the second leaves the first layers in flight, the first does not).
EVAL_GATHER_CONFIGS = (
    {"stage3_max_reuse_distance": 0, **PREFETCH_ONE_LAYER},
    {"stage3_max_reuse_distance": 2 * linear_numel(), "stage3_prefetch_bucket_size": linear_numel() - 1},
)


@pytest.mark.zero3_contract("base-j")
def test_z3_leaf_first_block(zero3_world):
    """A z3 leaf as the *first* block (``models_extra.first_block_model``): its input is the raw batch,
    which has no grad.

    The leaf is set both ways DeepSpeed offers: ``set_z3_leaf_modules`` and
    ``stage3_module_granularity_threshold``, each with prefetch off and on, and a leaf holding a
    reentrant activation checkpoint (``models_extra.CheckpointedLeaf``), whose checkpointed params plain
    torch never computes a gradient for (its other params it does).  ZeRO-3 reduces a leaf's gradients from a full backward hook
    on the leaf; with no input requiring grad, torch fires that hook when the output's gradient is
    known, before the leaf's parameter gradients exist.  Each run must train like plain torch and
    leave nothing gathered after each step, or refuse the leaf clearly before any weight changes: an
    exception in step 0's forward or backward, on every rank, that names the leaf's class and says
    that its input has no grad (DeepSpeed's own unit test ``test_no_grad_input_error`` expects such a
    ``RuntimeError``).  An obscure crash, a hang or silently wrong training fails.
    """
    threshold = {"stage3_module_granularity_threshold": FIRST_BLOCK_LEAF_THRESHOLD}
    # Two worlds, the threshold's last: a release without the key (before 0.16) fails there at
    # initialize, after the leaves set by set_z3_leaf_modules were judged.
    worlds = [
        {
            "set_z3_leaf_modules": ("first_leaf", {}),
            "set_z3_leaf_modules, prefetch 5e7": ("first_leaf", {"zero": PREFETCH_DEFAULT}),
            "reentrant checkpoint in the leaf": ("first_ckpt_leaf", {}),
        },
        {
            "granularity threshold": ("first_block", {"zero": threshold}),
            "threshold, prefetch 5e7": ("first_block", {"zero": {**threshold, **PREFETCH_DEFAULT}}),
        },
    ]
    trained_per_rank, trained_labels = [[] for _ in range(zero3_world.size)], []
    for runs in worlds:
        per_rank = zero3_world.run(fb.parity_many, [(model, {**kw, "refusable": True}) for model, kw in runs.values()])
        problems = []
        for i, label in enumerate(runs):
            rows = [rank_runs[i] for rank_runs in per_rank]
            if rows[0]["z3_leaves"] != ["0"]:
                problems.append(
                    f"scenario precondition ({label}): expected the first block ('0') as the only z3 leaf, got "
                    f"{rows[0]['z3_leaves']}"
                )
            if any(row["refused"] for row in rows):
                for rank, row in enumerate(rows):
                    if row["refused"]:
                        problems += fb.leaf_refusal_problems(row, f"{label}: rank {rank}")
                    else:
                        problems.append(f"{label}: rank {rank} trained where another rank refused the leaf")
        verdicts.assert_clean([problems], "step 0 raised, but not as a clear refusal of the z3 leaf")
        for i, label in enumerate(runs):
            if not per_rank[0][i]["refused"]:  # no rank refused it (checked above)
                trained_labels.append(label)
                for rank, rank_runs in enumerate(per_rank):
                    trained_per_rank[rank].append(rank_runs[i])
    _assert_nothing_left_after_step(trained_per_rank, trained_labels)
    _assert_parity(trained_per_rank, [f"z3 leaf on the first block, {label}" for label in trained_labels])


def _assert_nothing_left_after_step(per_rank, labels) -> None:
    """Each rank's per-step lifecycle findings of each run (state left over after ``engine.step()``) must be empty."""
    bad = [
        [
            f"{label}, after step {s}: {v}"
            for result, label in zip(runs, labels)
            for s, lines in enumerate(result["lifecycle"])
            for v in lines
        ]
        for runs in _runs(per_rank)
    ]
    verdicts.assert_clean(bad, "state left over after engine.step()")


@pytest.mark.zero3_contract("base-k")
def test_trace_cache_warnings_follow_the_key(zero3_world):
    """``log_trace_cache_warnings`` (ZeRO config, default false): "Whether to log warnings from trace cache,
    such as invalidation events" (``DeepSpeedZeroConfig``).  0.19.8's ``trace_prologue`` prints its invalidation message
    with ``print_rank_0(..., force=self.__log_trace_cache_warnings)``.  A model whose layer order
    reverses at step 3 invalidates the trace there; run with the key absent, false and true, every step
    captured (stdout, stderr, WARNING records, Python warnings).  Absent or false: no line mentioning the
    trace in any step (a trace that is invalidated every step, as with data-dependent branches, would
    flood the logs); true: rank 0 reports the invalidation in step 3.
    """
    step = fb.TRACE_WARNING_STEP
    problems = []
    settings = (None, False, True)
    per_rank = zero3_world.run(fb.trace_cache_warnings, settings)
    for i, setting in enumerate(settings):
        label = "key absent" if setting is None else f"log_trace_cache_warnings={str(setting).lower()}"
        runs = [rank_runs[i] for rank_runs in per_rank]
        for rank, run in enumerate(runs):
            if not run["complete"][step - 1] or run["complete"][step]:
                problems.append(
                    f"{label}: rank {rank}: the scenario did not invalidate a complete trace at step {step} "
                    f"(is_complete_trace() after each step: {run['complete']})"
                )
            if setting:
                continue
            for s, lines in enumerate(run["lines"]):
                problems += [f"{label}: rank {rank}: step {s} logged a trace-cache message: {line!r}" for line in lines]
        if setting and not runs[0]["lines"][step]:
            problems.append(f"{label}: rank 0 logged nothing about the trace invalidated at step {step}")
    verdicts.assert_clean([problems], "trace-cache warnings")
