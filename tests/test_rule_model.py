"""The rule model (``fixtures/rule/rules.py``) on hand-made traces: each rule, broken and kept, in milliseconds.

Every test names the DeepSpeed passage its rule comes from: the ZeRO config docs
(deepspeed.readthedocs.io "ZeRO" / "stage3_*" keys), deepspeed 0.19.8's
``runtime/zero/partitioned_param_coordinator.py`` (PPC) and ``parameter_offload.py`` (PO), and the
seeds (DeepSpeed PRs 9003, 8883, 8148, 8431).
"""

from pytest_zero3.fixtures.rule import rules as r
from pytest_zero3.fixtures.rule.rules import BWD_POST, BWD_PRE, END, FWD_POST, FWD_PRE, GRADS_IN, Event

N = 10  # numel of every param in these traces
NUMEL = {"w0": N, "w1": N, "w2": N}


def ev(kind, module="", recompute=False, params=None):
    if params is None:
        params = () if kind == END else (f"w{module[1:]}",)
    return Event(kind, module, tuple(params), recompute)


def mlp_events(layers=3):
    """Forward L0..Ln-1, backward Ln-1..L1 (L0's input needs no grad: its post-backward never fires), end."""
    out = []
    for i in range(layers):
        out += [ev(FWD_PRE, f"L{i}"), ev(FWD_POST, f"L{i}")]
    for i in reversed(range(layers)):
        out.append(ev(BWD_PRE, f"L{i}"))
        if i:
            out.append(ev(BWD_POST, f"L{i}"))
    return out + [ev(END)]


def step(events, gathered, numel=NUMEL, gathers=None, complete=True):
    """A StepRecord whose status after event i is AVAILABLE for the names in ``gathered[i]`` (a
    space-separated string), INFLIGHT for those ending in ``~``, else NOT_AVAILABLE."""
    status = []
    for g in gathered:
        names = g.split()
        state = {n.rstrip("~"): r.INFLIGHT if n.endswith("~") else r.AVAILABLE for n in names}
        status.append({p: state.get(p, r.NOT_AVAILABLE) for p in numel})
    return r.StepRecord(events, status, {p: r.NOT_AVAILABLE for p in numel}, gathers, complete)


#: The gathered sets of a correct coordinator at reuse distance 0, prefetch off, on ``mlp_events(3)``.
RELEASE_ALL = ["w0", "", "w1", "", "w2", "", "w2", "", "w1", "", "w0", ""]
ONCE_EACH = {"w0": 2, "w1": 2, "w2": 2}


def rules_of(violations):
    return sorted({v.rule for v in violations})


def test_release_all_at_distance_zero_is_clean():
    """Seed 000 (PR 9003): "stage3_max_reuse_distance: 0 now releases parameters as soon as each module's
    forward completes and re-gathers them during backward"."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    steps = [step(mlp_events(), RELEASE_ALL, gathers=ONCE_EACH)] * 3
    assert r.judge(cfg, steps) == []


def test_kept_past_the_window_is_rule_b():
    """Seed 000 / PPC ``__params_to_release``: only the reuse scan keeps a forward-gathered param; the
    0.19.8 prefetch-skip retention (issue 7670) that keeps w0 until backward breaks it."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    kept = ["w0", "w0", "w0 w1", "w0", "w0 w2", "w0", "w0 w2", "w0", "w0 w1", "w0", "w0", ""]
    violations = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), kept)])
    assert rules_of(violations) == ["rule-b"]
    first = violations[0]
    assert (first.step, first.event, first.param) == (1, 1, "w0") and "end of forward of 'L0'" in str(first)


def test_record_step_is_not_judged_for_the_window():
    """PPC ``release_sub_module``: without a complete trace every param of the module is released; the
    window applies from the second step.  Keeping w0 in step 0 is a rule-b violation (release all)."""
    cfg = r.Config(NUMEL, reuse_distance=10**9, prefetch_bucket=0, persistence_threshold=0)
    kept = ["w0", "w0", "w0 w1", "w0", "w0 w2", "w0", "w0 w2", "w0", "w0 w1", "w0", "w0", ""]
    assert [(v.rule, v.step, v.event) for v in r.judge(cfg, [step(mlp_events(), kept)])] == [("rule-b", 0, 1)]


def test_window_boundary_is_exact():
    """PPC ``__params_to_release``: ``if params_traversed >= max_reuse_dist_in_numel: break`` before each
    scanned module, so a module is in the window iff fewer than the distance elements precede it."""
    trace = [("a", ("pa",)), ("b", ("pb",)), ("c", ("pc",)), ("d", ("pd",))]
    numel = {"pa": 10, "pb": 10, "pc": 10, "pd": 10}
    assert r.reuse_window(trace, 1, 0, numel) == set()
    assert r.reuse_window(trace, 1, 1, numel) == {"pb"}
    assert r.reuse_window(trace, 1, 20, numel) == {"pb", "pc"}
    assert r.reuse_window(trace, 1, 19, numel) == {"pb", "pc"}
    assert r.reuse_window(trace, 1, 21, numel) == {"pb", "pc", "pd"}


def test_window_keeps_are_rule_c():
    """ZeRO docs, ``stage3_max_reuse_distance``: "Do not release a parameter if it will be reused within
    this threshold of parameters".  Distance 2 layers: w2 (last forward layer) is reused by the next
    module (its own backward), so it stays; w1's window (L2 forward, L2 backward) ends just before its
    backward use, so it goes.  Releasing w2 is rule-c and costs a second gather (rule-f)."""
    cfg = r.Config(NUMEL, reuse_distance=2 * N, prefetch_bucket=0, persistence_threshold=0)
    good = ["w0", "", "w1", "", "w2", "w2", "w2", "", "w1", "", "w0", ""]
    gathers = {"w0": 2, "w1": 2, "w2": 1}
    assert r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), good, gathers=gathers)]) == []
    bad = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), RELEASE_ALL, gathers=ONCE_EACH)])
    assert [(v.rule, v.param) for v in bad] == [("rule-c", "w2"), ("rule-f", "w2")]
    wider = dataclass_replace(cfg, reuse_distance=2 * N + 1)  # one element more: w1's backward use is in
    assert ("rule-c", "w1") in [
        (v.rule, v.param) for v in r.judge(wider, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), good)])
    ]


def test_running_module_params_are_rule_a():
    """PO: the pre hooks fetch and the post hooks release; PPC ``fetch_sub_module`` asserts every param is
    AVAILABLE before the module runs.  A param partitioned while its module runs is rule-a."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    bad = list(RELEASE_ALL)
    bad[6] = ""  # after L2's backward pre hook, w2 missing
    assert rules_of(r.judge(cfg, [step(mlp_events(), bad)])) == ["rule-a"]


def test_recompute_frozen_params_stay_for_the_owning_backward():
    """Seed 002 / PR 8148: frozen params gathered by a non-reentrant checkpoint recompute are attributed
    to the backward module that triggered it and released with its backward, not at the recompute's
    forward end (else CheckpointError).  Trace: F (frozen, checkpointed) -> T; backward of T recomputes F."""
    numel = {"f": N, "t": N}
    events = [
        ev(FWD_PRE, "F", params=["f"]),
        ev(FWD_POST, "F", params=["f"]),
        ev(FWD_PRE, "T", params=["t"]),
        ev(FWD_POST, "T", params=["t"]),
        ev(BWD_PRE, "T", params=["t"]),
        ev(FWD_PRE, "F", True, ["f"]),
        ev(FWD_POST, "F", True, ["f"]),
        ev(BWD_POST, "T", params=["t"]),
        ev(END),
    ]
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0, frozen=frozenset({"f"}))
    good = ["f", "", "t", "", "t", "t f", "t f", "", ""]
    assert r.judge(cfg, [step(events, good, numel)] * 2) == []
    early = ["f", "", "t", "", "t", "t f", "t", "", ""]
    assert rules_of(r.judge(cfg, [step(events, early, numel)] * 2)) == ["rule-a"]
    cfg_trainable = dataclass_replace(cfg, frozen=frozenset())
    assert rules_of(r.judge(cfg_trainable, [step(events, good, numel)] * 2)) == ["rule-b"]


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_persistent_params_stay_within_the_step():
    """ZeRO docs, ``stage3_param_persistence_threshold``: "Do not partition parameters smaller than this
    threshold"; PPC ``__params_to_release`` drops ``ds_persist`` params.  Partitioning one mid-step (and
    gathering it again) is rule-e; on the recording step 0.19.8 does partition them: allowed there."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=N)  # all persistent
    keep = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2"] + ["w0 w1 w2"] * 7
    first = step(mlp_events(), RELEASE_ALL)
    assert r.judge(cfg, [first, step(mlp_events(), keep, gathers={"w0": 1, "w1": 1, "w2": 1})]) == []
    dropped = step(mlp_events(), RELEASE_ALL, gathers=ONCE_EACH)
    assert rules_of(r.judge(cfg, [first, dropped])) == ["rule-e", "rule-f"]


#: The gathered sets of a correct coordinator at reuse distance 0 with a one-layer bucket on ``mlp_events(3)``
#: (trace L0 L1 L2 L2 L1 L0): after each fetch the next layer not yet gathered is in flight.
PREFETCH_ONE = ["w0 w1~", "w1~", "w1 w2~", "w2~", "w2 w1~", "w1~", "w2 w1~ w0~", "w1~ w0~", "w1 w0~", "w0~", "w0", ""]


def test_prefetch_window_and_bucket():
    """ZeRO docs, ``stage3_prefetch_bucket_size``: "The size of the fixed buffer for prefetching
    parameters"; PPC ``_fetch_sub_module_impl`` prefetches in trace order until the bucket's numel is
    reached, only with bucket > 0.  In-flight params count as gathered (an in-flight all-gather holds
    its output buffer).  Exact: too far and too little are both rule-d's."""
    no_prefetch = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    early = list(RELEASE_ALL)
    early[0] = "w0 w1~"  # w1 in flight at L0's start
    steps = [step(mlp_events(), RELEASE_ALL), step(mlp_events(), early)]
    assert rules_of(r.judge(no_prefetch, steps)) == ["rule-d"]
    one_layer = dataclass_replace(no_prefetch, prefetch_bucket=N)
    assert r.judge(one_layer, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), PREFETCH_ONE)]) == []
    too_far = list(PREFETCH_ONE)
    too_far[0] = "w0 w1~ w2~"
    steps = [step(mlp_events(), RELEASE_ALL), step(mlp_events(), too_far)]
    assert rules_of(r.judge(one_layer, steps)) == ["rule-d"]
    # too little: the prefetch after L0's fetch never issued
    short = list(PREFETCH_ONE)
    short[0], short[1] = "w0", ""
    found = r.judge(one_layer, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), short)])
    assert [(v.rule, v.event, v.param) for v in found][:1] == [("rule-d", 0, "w1")]
    # an eval forward prefetches like a training one (nothing in fetch_sub_module reads module.training)
    fwd_only = mlp_events()[:6]
    lazy_eval = step(fwd_only, ["w0", "", "w1", "", "w2", ""])
    found = r.judge(one_layer, [step(mlp_events(), RELEASE_ALL), lazy_eval])
    assert [(v.rule, v.event, v.param) for v in found][:1] == [("rule-d", 0, "w1")]


def test_gathered_params_are_skipped_without_charge():
    """PPC ``_fetch_sub_module_impl``: ``do_prefetch = param.ds_status == NOT_AVAILABLE`` and
    ``numel_prefetching`` grows only for a prefetched param.  At L2's forward start w2 (gathered, its
    backward use next in the trace) is skipped, and the one-layer bucket still takes w1: a prefetcher
    that charges w2 against the bucket stops there."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=N, persistence_threshold=0)
    charged = list(PREFETCH_ONE)
    charged[4], charged[5] = "w2", ""
    found = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), charged)])
    assert [(v.rule, v.event, v.param) for v in found][:1] == [("rule-d", 4, "w1")]


def test_max_live_parameters_bounds_prefetch():
    """ZeRO docs, ``stage3_max_live_parameters``: "The maximum number of parameters resident per GPU
    before releasing"; PPC limits a prefetch to ``max_available - n_available``, the numel gathered or in
    flight after the module's own fetch."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=10 * N, max_live=1, persistence_threshold=0)
    far = list(RELEASE_ALL)
    far[0] = "w0 w1~ w2~"
    steps = [step(mlp_events(), RELEASE_ALL), step(mlp_events(), far)]
    assert {v.rule for v in r.judge(cfg, steps)} == {"rule-d"}
    assert r.judge(cfg, [step(mlp_events(), RELEASE_ALL)] * 2) == []
    # one element of room: each prefetch takes one layer, none at all where two layers are live (L2's backward)
    capped = ["w0 w1~", "w1~", "w1 w2~", "w2~", "w2 w1~", "w1~", "w2 w1~", "w1~", "w1 w0~", "w0~", "w0", ""]
    room = dataclass_replace(cfg, max_live=N + 1)
    assert r.judge(room, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), capped)]) == []
    assert {v.rule for v in r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), capped)])} == {"rule-d"}


def test_gather_count_is_exact():
    """Seed 000 (PR 9003, default 1e9 "params are still kept resident through backward"): each param is
    gathered once per step at the default distance; a second gather means a release inside the window."""
    cfg = r.Config(NUMEL, prefetch_bucket=0, persistence_threshold=0)
    keep = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2", "w0 w1 w2", "w0 w1 w2", "w0 w1", "w0 w1", "w0", "w0", ""]
    once = {"w0": 1, "w1": 1, "w2": 1}
    assert r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), keep, gathers=once)]) == []
    twice = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), keep, gathers={**once, "w1": 2})])
    assert [(v.rule, v.param) for v in twice] == [("rule-f", "w1")]


def test_everything_partitioned_after_backward():
    """PPC ``release_backward_leftovers`` (stage3 ``backward_epilogue``): modules whose post-backward hook
    never fired are released at the end of backward; nothing but persistent params stays."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    left = list(RELEASE_ALL)
    left[-1] = "w0"
    assert [(v.rule, v.event) for v in r.judge(cfg, [step(mlp_events(), left)])] == [("rule-b", 11)]


def test_changed_order_retraces():
    """PPC ``trace_prologue``: a module other than the trace's invalidates it (the rest of the step releases
    everything); ``reset_step`` then records and the step after is complete again (rule-g: the
    coordinator must say so)."""
    cfg = r.Config(NUMEL, prefetch_bucket=0, persistence_threshold=0)
    swapped = [ev(FWD_PRE, "L1"), ev(FWD_POST, "L1"), ev(FWD_PRE, "L0"), ev(FWD_POST, "L0"), ev(END)]
    trace = r.Trace()
    keep = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2", "w0 w1 w2", "w0 w1 w2", "w0 w1", "w0 w1", "w0", "w0", ""]
    steps = [
        step(mlp_events(), RELEASE_ALL),
        step(mlp_events(), keep),
        step(swapped, ["w1", "", "w0", "", ""]),  # deviates at its first fetch: release everything
        step(mlp_events(), RELEASE_ALL),  # records
        step(mlp_events(), keep, complete=False),
    ]
    violations = r.judge(cfg, steps, trace)
    assert [(v.rule, v.step) for v in violations] == [("rule-g", 4)]
    assert trace.mode == "complete" and [m for m, _ in trace.modules][:3] == ["L0", "L1", "L2"]


def test_eval_forward_uses_the_training_trace():
    """PPC: an eval forward matches the recorded trace's forward prefix, so the window still sees the
    backward uses (the default distance keeps every param through it); nothing is counted or judged at
    an end of backward that never comes."""
    cfg = r.Config(NUMEL, prefetch_bucket=0, persistence_threshold=0)
    fwd_only = mlp_events()[:6]
    kept = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2", "w0 w1 w2"]
    assert r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(fwd_only, kept)]) == []
    released = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(fwd_only, RELEASE_ALL[:6])])
    assert rules_of(released) == ["rule-c"]


def test_prefetch_left_in_flight_by_an_eval_forward_is_gathered_anew():
    """PPC ``reset_step`` -> ``_clean_inflight_param_registry``: the next pass starts by completing every
    outstanding all-gather and partitioning what no module claims.  An eval forward ends mid-trace with
    its last prefetch (w1, for its backward use) still in flight: the training step after it gathers w1
    twice like the others, while what the eval pass's reuse scan kept (AVAILABLE) stays held."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=N, persistence_threshold=0)
    fwd_only = mlp_events()[:6]
    eval_pass = ["w0 w1~", "w1~", "w1 w2~", "w2~", "w2 w1~", "w1~"]
    train = ["w0 w1~", "w1~", "w1 w2~", "w2~", "w2 w1~", "w1~", "w2 w1~ w0~", "w1~ w0~", "w1 w0~", "w0~", "w0", ""]
    after_eval = step(mlp_events(), train, gathers=ONCE_EACH)
    after_eval.start = {**after_eval.start, "w1": r.INFLIGHT}
    steps = [step(mlp_events(), RELEASE_ALL), step(fwd_only, eval_pass), after_eval]
    assert r.judge(cfg, steps) == []
    once_more = dataclass_replace(after_eval, gathers={**ONCE_EACH, "w1": 3})
    assert [(v.rule, v.step, v.param) for v in r.judge(cfg, steps[:2] + [once_more])] == [("rule-f", 2, "w1")]
    # kept by the eval pass's reuse scan (default distance): held at the start, gathered no more
    keep_cfg = r.Config(NUMEL, prefetch_bucket=0, persistence_threshold=0)
    kept = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2", "w0 w1 w2"]
    held = ["w0 w1 w2"] * 7 + ["w0 w1"] * 2 + ["w0"] * 2 + [""]
    resumed = step(mlp_events(), held, gathers={})
    resumed.start = {p: r.AVAILABLE for p in NUMEL}
    assert r.judge(keep_cfg, [step(mlp_events(), RELEASE_ALL), step(fwd_only, kept), resumed]) == []


def test_early_stopped_recompute_is_closed_by_the_backward():
    """PPC ``release_sub_module``: ``param.ds_active_sub_modules.discard(submodule.ds_id)``: one claim per
    module.  With checkpoint early stop on, a recompute's forward may never reach its post hook; the
    module's own post-backward ends that claim, and its params go."""
    numel = {"t": N}
    events = [
        ev(FWD_PRE, "T", params=["t"]),
        ev(FWD_POST, "T", params=["t"]),
        ev(BWD_PRE, "T", params=["t"]),
        ev(FWD_PRE, "T", True, ["t"]),  # recompute, stopped early
        ev(BWD_POST, "T", params=["t"]),
        ev(END),
    ]
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    assert r.judge(cfg, [step(events, ["t", "", "t", "t", "", ""], numel)] * 2) == []


def test_post_backward_hook_runs_before_autograd_leaves_the_inputs():
    """PO ``PostBackwardFunctionModule``: the release runs once the gradients of the inputs of the module's
    forward call are computed.  The probe sees that moment apart from DeepSpeed's hooks (GRADS_IN); a
    module still running backward there missed its release, which the end of backward would hide."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    kept = mlp_events()
    kept.insert(kept.index(ev(BWD_POST, "L2")) + 1, ev(GRADS_IN, "L2"))
    gathered = ["w0", "", "w1", "", "w2", "", "w2", "", "", "w1", "", "w0", ""]
    assert r.judge(cfg, [step(kept, gathered)] * 3) == []
    missed = [e for e in kept if e != ev(BWD_POST, "L2")]  # the hook never fired
    held = ["w0", "", "w1", "", "w2", "", "w2", "w2", "w1 w2", "w2", "w0 w2", ""]
    found = r.judge(cfg, [step(missed, held)] * 3)
    assert {(v.rule, v.param, v.module) for v in found} == {("rule-b", "w2", "L2")}, found
    assert "post-backward hook" in str(found[0]) and "autograd done with the inputs of 'L2'" in str(found[0])
    # where the hook would keep the param anyway (persistent) a missed hook releases nothing
    persistent = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=N)
    assert not [v for v in r.judge(persistent, [step(missed, held)] * 3) if v.rule == "rule-b" and v.event == 7]


def test_persistent_params_after_an_invalidation_are_not_judged():
    """PPC ``release_sub_module``: once ``trace_prologue`` invalidated the trace mid-step the release set is
    every param of the module, persistent ones included (0.19.x), while the reference keeps them: a
    second gather of a persistent param in that step is allowed."""
    cfg = r.Config(NUMEL, prefetch_bucket=0, persistence_threshold=N)
    keep = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2"] + ["w0 w1 w2"] * 7
    swapped = [
        ev(FWD_PRE, "L1"),
        ev(FWD_POST, "L1"),
        ev(FWD_PRE, "L0"),
        ev(FWD_POST, "L0"),
        ev(BWD_PRE, "L0"),
        ev(BWD_POST, "L0"),
        ev(BWD_PRE, "L1"),
        ev(BWD_POST, "L1"),
        ev(END),
    ]
    dropped = step(swapped, ["w1", "", "w0", "", "w0", "", "w1", "", ""], gathers={"w0": 2, "w1": 2})
    assert r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), keep), dropped]) == []


def test_rule_statements_are_the_registry_statements():
    """The model names its rules in failures; the report takes the registry's text: they must agree."""
    from pytest_zero3 import registry

    contracts = registry.load()
    assert {rule: contracts[rule].statement for rule in r.RULES} == r.RULES


def test_default_examples_are_reproducible():
    """The rule family's default examples are the same on every run: CI must not flake on a new draw."""
    import json

    from pytest_zero3.fixtures.pytest_side import rule_generation

    assert json.dumps(rule_generation.draw_examples(4, None)) == json.dumps(rule_generation.draw_examples(4, None))
    assert json.dumps(rule_generation.draw_examples(4, 7)) == json.dumps(rule_generation.draw_examples(4, 7))
    assert json.dumps(rule_generation.draw_examples(4, 7)) != json.dumps(rule_generation.draw_examples(4, None))


def _external_events(step0: bool):
    """L0 (w0) then L1 (w1, and w0 as an external param: DeepSpeed's getter registers it during L1's
    first forward, so L1's pre event of the record step does not list it yet)."""
    l1_pre = ("w1",) if step0 else ("w0", "w1")
    return [
        ev(FWD_PRE, "L0"),
        ev(FWD_POST, "L0"),
        ev(FWD_PRE, "L1", params=l1_pre),
        ev(FWD_POST, "L1", params=("w0", "w1")),
        ev(BWD_PRE, "L1", params=("w0", "w1")),
        ev(BWD_POST, "L1", params=("w0", "w1")),
        ev(BWD_PRE, "L0"),
        ev(END),
    ]


def test_external_param_joins_its_users_trace():
    """PO ``ZeROOrderedDict.__getitem__`` / ``register_external_parameter`` docs: a param of another module
    used in a forward is registered with the running module and gathered at its hooks from then on; PPC
    ``construct_parameter_trace_from_module_trace`` builds the trace from ``iter_params`` (externals
    included).  So at a window of one param, L0's end keeps w0 for L1's next use in step 1."""
    numel = {"w0": N, "w1": N}
    cfg = r.Config(numel, reuse_distance=N, prefetch_bucket=0, persistence_threshold=0)
    record = step(_external_events(True), ["w0", "", "w1", "", "w0 w1", "", "w0", ""], numel)
    complete = step(_external_events(False), ["w0", "w0", "w0 w1", "w0 w1", "w0 w1", "w0", "w0", ""], numel)
    complete.start = {p: r.NOT_AVAILABLE for p in numel}
    complete.gathers = {"w0": 1, "w1": 1}
    assert r.judge(cfg, [record, complete]) == []


def test_external_param_must_be_gathered_by_its_users_hook():
    """PO ``pre_sub_module_forward_function`` fetches ``iter_params`` of the module, external params
    included: leaving w0 to DeepSpeed's getter (gathered later, inside L1's forward) breaks rule-a."""
    numel = {"w0": N, "w1": N}
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    record = step(_external_events(True), ["w0", "", "w1", "", "w0 w1", "", "w0", ""], numel)
    lazy = step(_external_events(False), ["w0", "", "w1", "", "w0 w1", "", "w0", ""], numel)
    violations = r.judge(cfg, [record, lazy])
    assert [(v.rule, v.step, v.event, v.param) for v in violations] == [("rule-a", 1, 2, "w0")]


def _returned_events(step0: bool):
    """P runs C, which returns its own param w1; P uses w1 after C ended.  DeepSpeed's post-forward hook
    registers w1 with P at C's end, so P's pre event of the record step does not list it yet."""
    return [
        ev(FWD_PRE, "P", params=() if step0 else ("w1",)),
        ev(FWD_PRE, "C1"),
        ev(FWD_POST, "C1"),
        ev(FWD_POST, "P", params=("w1",)),
        ev(BWD_PRE, "P", params=("w1",)),
        ev(BWD_PRE, "C1"),
        ev(BWD_POST, "P", params=("w1",)),
        ev(END),
    ]


def test_returned_param_is_the_callers_until_the_caller_ends():
    """PO ``_post_forward_module_hook``: a ZeRO param in a module's output is registered as an external
    param of the module on top of ``FWD_MODULE_STACK`` (the caller) before the module's release; ZeRO docs
    "Returning a parameter ... register it with submodules that use" it; ``register_external_parameter``
    docs: DeepSpeed then coordinates its "collection and partitioning" with that module.  So w1 stays
    gathered past C1's end (rule-a) and goes with P's release (rule-b), at the end of backward too (C1's
    post-backward never fires: its forward has no input)."""
    numel = {"w1": N}
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0, returns={"C1": {"w1"}})
    good = ["", "w1", "w1", "", "w1", "w1", "w1", ""]
    assert r.judge(cfg, [step(_returned_events(True), good, numel)]) == []
    dropped = ["", "w1", "", "", "w1", "w1", "w1", ""]  # partitioned by the module that returned it
    violations = r.judge(cfg, [step(_returned_events(True), dropped, numel)])
    assert [(v.rule, v.event, v.param) for v in violations] == [("rule-a", 2, "w1")]
    kept = ["", "w1", "w1", "w1", "w1", "w1", "w1", "w1"]  # never partitioned by a hook (DeepSpeed 0.19.8)
    violations = r.judge(cfg, [step(_returned_events(True), kept, numel)])
    assert [(v.rule, v.event, v.param) for v in violations] == [("rule-b", 3, "w1"), ("rule-b", 7, "w1")]


def _rehooked_events():
    events = mlp_events(2)
    return events[:4] + [Event(r.REHOOK)] + events[4:]


def test_hooks_registered_again_drop_a_half_recorded_trace():
    """PO ``_register_deepspeed_module`` on the root calls ``coordinator._invalidate_trace()`` (stage3.py's
    ``unwrap_model_for_generation`` does on exit); PPC ``_invalidate_trace`` clears the trace structures
    (``_clear_trace_structures``: the recorded module order too).  Hooks registered again between the
    first forward and its backward: step 0's recording is dropped, step 1 records, step 2 is complete."""
    numel = {"w0": N, "w1": N}
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    first = step(_rehooked_events(), ["w0", "", "w1", "", "", "w1", "", "w0", ""], numel, complete=False)
    plain = ["w0", "", "w1", "", "w1", "", "w0", ""]
    gathers = {"w0": 2, "w1": 2}
    recording = step(mlp_events(2), plain, numel, gathers, complete=False)
    assert r.judge(cfg, [first, recording, step(mlp_events(2), plain, numel, gathers)]) == []
    # without the re-registration step 1 must be complete (rule-g): the event is what moves the trace
    no_rehook = step(mlp_events(2), plain, numel, gathers, complete=False)
    violations = r.judge(cfg, [no_rehook, recording])
    assert [(v.rule, v.step) for v in violations] == [("rule-g", 1)]
    trace = r.Trace()
    r.judge(cfg, [first], trace)
    assert trace.mode == "invalid" and trace.recording == []


#: 0.19.8 at reuse distance 0 with a two-layer prefetch bucket: L1's fetch walks the trace past the backward
#: uses of w1 (skipped: gathered) and w0 (prefetched), so its release keeps w1 for its backward use.
RETAINED = ["w0 w1~ w2~", "w1~ w2~", "w1 w2~ w0~", "w1 w2~ w0~", "w1 w2 w0~", "w1 w0~", "w1 w2 w0~", "w1 w0~"]
RETAINED += ["w1 w0~", "w0~", "w0", ""]


def test_a_known_behaviour_explains_exactly_its_own_violations():
    """Issue 53: a known bug is stated as precisely as the rule, as an executable relaxation of it.  The
    retention's violation is marked legal under it; a param kept that no relaxation keeps (w0 after L0's
    forward, a second bug) is not, so an expectation naming the relaxation explains the first only."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=2 * N, persistence_threshold=0)
    found = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), RETAINED)])
    assert [(v.rule, v.event, v.param, v.legal_under) for v in found] == [
        ("rule-b", 3, "w1", ("prefetch-skip-retention",))
    ]
    assert str(found[0]).endswith("[legal under: prefetch-skip-retention]")
    second = list(RETAINED)
    for i in range(1, 10):  # w0 also kept from its forward to its backward
        second[i] = " ".join(["w0"] + [n for n in second[i].split() if n != "w0~"])
    found = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), second)])
    assert [(v.event, v.param, v.legal_under) for v in found] == [
        (1, "w0", ()),
        (3, "w1", ("prefetch-skip-retention",)),
    ]
    # a correct coordinator: no violation, and no relaxed run
    assert r.judge(dataclass_replace(cfg, prefetch_bucket=0), [step(mlp_events(), RELEASE_ALL)] * 2) == []


def test_a_returned_param_kept_is_legal_under_its_relaxation_only():
    """0.19.8 never releases a param a module returns (the caller's external param) until the optimizer
    step: each event that should have partitioned it is legal under ``returned-param-kept``, and the same
    coordinator keeping a param nobody returns (w0 after the backward pass) is not."""
    cfg = r.Config(
        NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0, returns={"L1": frozenset({"w1"})}
    )
    kept = ["w0", "", "w1", "w1", "w1 w2", "w1", "w1 w2", "w1", "w1", "w1", "w0 w1", "w0 w1"]
    found = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), kept)])
    assert [(v.event, v.param, v.legal_under) for v in found] == [
        (3, "w1", ("returned-param-kept",)),
        (9, "w1", ("returned-param-kept",)),
        (11, "w0", ()),
        (11, "w1", ("returned-param-kept",)),
    ]


def test_a_violation_is_a_record_keyed_by_rule_and_place():
    """Issue 53 item 1: a violation's problem is keyed by its rule, what it found and where (step, event,
    module, param), never by the numbers of its detail: the same violation with another count or window
    has the same key, another param or event another."""
    cfg = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0)
    kept = ["w0", "w0", "w0 w1", "w0", "w0 w2", "w0", "w0 w2", "w0", "w0 w1", "w0", "w0", ""]
    first = r.judge(cfg, [step(mlp_events(), RELEASE_ALL), step(mlp_events(), kept)])[0]
    problem = first.problem
    assert str(problem) == str(first)
    assert problem.key == "rule-b: is AVAILABLE; must be partitioned | step=1 | event=1 | module=L0 | param=w0"
    wider = r.judge(
        r.Config(NUMEL, reuse_distance=1, prefetch_bucket=0, persistence_threshold=0),
        [step(mlp_events(), RELEASE_ALL), step(mlp_events(), kept)],
    )
    same = [
        v for v in wider if (v.rule, v.step, v.event, v.param) == (first.rule, first.step, first.event, first.param)
    ]
    assert same and str(same[0]) != str(first) and same[0].problem.key == problem.key


def forward_events(layers=3):
    """An eval forward: L0..Ln-1, no backward."""
    return [e for i in range(layers) for e in (ev(FWD_PRE, f"L{i}"), ev(FWD_POST, f"L{i}"))]


def boundary(gathered, where, numel=NUMEL):
    """A Boundary: AVAILABLE for the names in ``gathered``, INFLIGHT for those ending in ``~``."""
    state = {n.rstrip("~"): r.INFLIGHT if n.endswith("~") else r.AVAILABLE for n in gathered.split()}
    return r.Boundary({p: state.get(p, r.NOT_AVAILABLE) for p in numel}, where)


def test_between_passes_only_what_the_release_rules_left_may_stay_gathered():
    """PPC ``release_sub_module`` and PO ``release_backward_leftovers``: a pass releases what the rules
    release, and nothing gathers between passes.  After a training step nothing but persistent params is
    gathered; after an eval forward the reuse window keeps what its backward would use (seq-a's action
    boundaries); once a boundary finds a param partitioned, a later one may not find it gathered."""
    cfg = r.Config(NUMEL, reuse_distance=10**9, prefetch_bucket=0, persistence_threshold=0)
    window = ["w0", "w0", "w0 w1", "w0 w1", "w0 w1 w2", "w0 w1 w2"]  # a complete trace: backward reuses all
    train = step(mlp_events(), window + ["w0 w1 w2", "w0 w1", "w0 w1", "w0", "w0", ""])
    record = step(mlp_events(), RELEASE_ALL)  # the first step records the trace: every release releases
    ok = [record, train, boundary("", "after 1"), step(forward_events(), window), boundary("w0 w1 w2", "after 2")]
    assert r.judge(cfg, ok) == []
    after_train = r.judge(cfg, [record, boundary("w1", "after 0")])
    assert [(v.rule, v.step, v.param, v.where) for v in after_train] == [("rule-b", 0, "w1", "after 0")]
    assert "step 0 (after 0): param 'w1' is AVAILABLE" in str(after_train[0])
    regathered = ok[:-1] + [boundary("w0", "after 2"), boundary("w0 w2", "after 3")]
    assert [(v.param, v.where) for v in r.judge(cfg, regathered)] == [("w2", "after 3")]
    # rule-d: the last forward fetch prefetches the backward's first use, which no backward consumes
    prefetching = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=N, persistence_threshold=0)
    released = ["w0 w1~", "w1~", "w1 w2~", "w2~", "w2 w1~", "w1~"]  # distance 0, prefetch one param ahead
    eval_pass = [record, step(forward_events(), released)]
    assert r.judge(prefetching, eval_pass + [boundary("w1~", "after 1")]) == []
    assert [v.param for v in r.judge(prefetching, eval_pass + [boundary("w0 w1~", "after 1")])] == ["w0"]
    persistent = r.Config(NUMEL, reuse_distance=0, prefetch_bucket=0, persistence_threshold=N)
    assert r.judge(persistent, [step(mlp_events(), ["w0 w1 w2"] * 12), boundary("w0 w1 w2", "after 0")]) == []


def _leaf_scan(numel, leaves, nested):
    return r.Config(numel, reuse_distance=1, prefetch_bucket=0, persistence_threshold=0, leaves=leaves, nested=nested)


def test_the_reuse_scan_read_with_the_released_modules_leaf_flag_is_legal_under_its_relaxation_only():
    """0.19.8's ``__params_to_release`` reads each scanned module with the *released* module's z3-leaf flag
    (``iter_params(module, recurse=z3_leaf_module(submodule_to_release))``, the bug of 000-e, PR 9003).
    From A (no leaf) the leaf L counts none of its children's params, so the scan at distance 1 reaches E,
    which uses A's ``a`` (an external param): ``a`` is kept where the rules release it.  From the leaf L
    its parent P counts its whole subtree, L's ``l0`` too, so ``l0`` is kept; L runs without backward, and
    the end of backward releases only modules whose backward began: ``l0`` stays.  Both legal under
    ``reuse-scan-leaf-flag``; a param kept that no reading of the scan keeps (``l0`` after L's forward
    in the first model) is not."""
    numel = {"a": N, "e": N, "l0": N}
    cfg = _leaf_scan(numel, frozenset({"L"}), {"L": frozenset({"l0"})})
    a, e, l0 = ("a",), ("a", "e"), ("l0",)
    events = [ev(FWD_PRE, "A", params=a), ev(FWD_POST, "A", params=a), ev(FWD_PRE, "L", params=l0)]
    events += [ev(FWD_POST, "L", params=l0), ev(FWD_PRE, "E", params=e), ev(FWD_POST, "E", params=e)]
    events += [ev(BWD_PRE, "E", params=e), ev(BWD_POST, "E", params=e), ev(BWD_PRE, "L", params=l0)]
    events += [ev(BWD_POST, "L", params=l0), ev(BWD_PRE, "A", params=a), ev(END)]
    recorded = step(events, ["a", "", "l0", "", "a e", "", "a e", "", "l0", "", "a", ""], numel)
    kept = ["a", "a", "a l0", "a", "a e", "a e", "a e", "a", "a l0", "a", "a", ""]
    found = r.judge(cfg, [recorded, step(events, kept, numel, gathers={"a": 1, "e": 1, "l0": 2})])
    assert [(v.rule, v.event, v.param, v.legal_under) for v in found] == [
        ("rule-b", 1, "a", ("reuse-scan-leaf-flag",)),
        ("rule-b", 7, "a", ("reuse-scan-leaf-flag",)),
        ("rule-f", -1, "a", ("reuse-scan-leaf-flag",)),
    ]
    also = [s if i < 3 or i > 7 else f"{s} l0" for i, s in enumerate(kept)]
    found = r.judge(cfg, [recorded, step(events, also, numel, gathers={"a": 1, "e": 1, "l0": 1})])
    assert {v.param for v in found if not v.legal_under} == {"l0"}
    assert {v.param for v in found if v.legal_under} == {"a"}

    numel = {"p": N, "l0": N}
    cfg = _leaf_scan(numel, frozenset({"L"}), {"P": frozenset({"l0"})})
    events = [ev(FWD_PRE, "P", params=("p",)), ev(FWD_PRE, "L", params=l0), ev(FWD_POST, "L", params=l0)]
    events += [ev(FWD_POST, "P", params=("p",)), ev(BWD_PRE, "P", params=("p",)), ev(BWD_POST, "P", params=("p",))]
    events += [ev(END)]
    recorded = step(events, ["p", "p l0", "p", "", "p", "", ""], numel)
    kept = step(events, ["p", "p l0", "p l0", "p l0", "p l0", "l0", "l0"], numel, gathers={"p": 1, "l0": 1})
    assert [(v.rule, v.event, v.param, v.legal_under) for v in r.judge(cfg, [recorded, kept])] == [
        ("rule-b", 2, "l0", ("reuse-scan-leaf-flag",)),
        ("rule-b", 6, "l0", ("reuse-scan-leaf-flag",)),
    ]
    # no leaf flagged: nothing to read otherwise, the same coordinator breaks the rules outright
    plain = dataclass_replace(cfg, leaves=frozenset())
    assert all(not v.legal_under for v in r.judge(plain, [recorded, kept]))


def test_a_recompute_releasing_a_persistent_param_is_legal_under_its_relaxation_off_a_complete_trace_only():
    """0.19.8's ``release_sub_module`` releases every param of the module where the trace is not complete
    (persistent ones too) and drops the ``ds_persist`` ones where it is: the end of a recompute forward (the
    bug of 002-g, "recompute-releases-claimed") partitions a claimed persistent param on the recording step
    and keeps it on a complete trace, so only the first is legal under that relaxation."""
    numel = {"t": N}
    events = [
        ev(FWD_PRE, "T", params=["t"]),
        ev(FWD_POST, "T", params=["t"]),
        ev(BWD_PRE, "T", params=["t"]),
        ev(FWD_PRE, "T", True, ["t"]),
        ev(FWD_POST, "T", True, ["t"]),  # the recompute's end partitions t, claimed by T's backward
        ev(BWD_POST, "T", params=["t"]),
        ev(END),
    ]
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=N)  # t is persistent
    recorded = step(events, ["t", "", "t", "t", "", "", ""], numel)
    kept = step(events, ["t", "t", "t", "t", "t", "t", "t"], numel)
    released = step(events, ["t", "t", "t", "t", "", "", ""], numel)
    found = r.judge(cfg, [recorded, kept, released])
    assert [(v.rule, v.step, v.event, v.legal_under) for v in found if v.rule == "rule-a"] == [
        ("rule-a", 0, 4, ("recompute-releases-claimed",)),
        ("rule-a", 2, 4, ()),
    ], found


def test_an_entry_explains_a_combination_of_known_behaviours_only_where_it_names_all_of_them():
    """Why (issue 53, item 2): a violation legal only under several relaxations together was labelled with
    all of them joined, and an entry whose pattern found one name in the label explained it.  0.19.8's
    entries explain a label only where one of its alternatives is made of relaxations the entry names."""
    from pathlib import Path

    from pytest_zero3 import expectations

    listed = expectations.load(Path(__file__).parents[1] / "conformance" / "expectations" / "deepspeed-0.19.8.toml")

    def line(*legal_under: str) -> str:
        detail = "is AVAILABLE; must be partitioned"
        return str(r.Violation("rule-b", 1, 3, "end of forward of 'l0'", "w0", detail, "l0", legal_under=legal_under))

    rule_b, zoo_a = listed["rule-b"], listed["zoo-a"]
    assert rule_b.explains(line("prefetch-skip-retention"))
    assert rule_b.explains(line("prefetch-skip-retention + live-count-reset"))  # both named by rule-b's entry
    assert rule_b.explains(line("recompute-releases-claimed", "release-cache + reuse-scan-leaf-flag"))
    assert not rule_b.explains(line("prefetch-skip-retention + recompute-releases-claimed"))
    assert not rule_b.explains(line(" + ".join(r.RELAXATIONS)))  # all of them together: more than it names
    assert not rule_b.explains(line())  # legal under none
    assert zoo_a.explains(line("prefetch-skip-retention"))
    assert not zoo_a.explains(line("prefetch-skip-retention + release-cache"))


def test_a_violation_two_known_behaviours_explain_only_together_is_labelled_with_the_pair():
    """``judge`` tries each relaxation alone, then each pair: 0.19.8's live-count reset (prefetch's budget
    larger by what was gathered at the step's start, here the persistent ``p1`` and ``p2``) lets L1's
    prefetch walk past w1's backward use, and the retention (PR 9003's bug) then keeps w1 at L1's end for
    that use.  Neither alone keeps it: without the reset the budget is spent and the walk stops before
    the use; without the retention nothing keeps what a walk passed.  The violation is legal under the
    pair and under neither of its halves; the prefetches the reset alone allows are labelled with it
    alone.  With nothing gathered at the step's start the reset adds nothing, and no label is found."""
    numel = {"w0": 30, "p1": 20, "p2": 20, "w1": 30, "w2": 30}
    layer0 = ("w0", "p1", "p2")
    events = []
    for module, params in (("L0", layer0), ("L1", ("w1",)), ("L2", ("w2",))):
        events += [ev(FWD_PRE, module, params=params), ev(FWD_POST, module, params=params)]
    for module, params in (("L2", ("w2",)), ("L1", ("w1",))):
        events += [ev(BWD_PRE, module, params=params), ev(BWD_POST, module, params=params)]
    events += [ev(BWD_PRE, "L0", params=layer0), ev(END)]
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=1000, max_live=70, persistence_threshold=20)
    assert cfg.persistent == {"p1", "p2"}
    p = "p1 p2 "
    recorded = step(events, [p + s for s in ("w0", "", "w1", "", "w2", "", "w2", "", "w1", "", "w0", "")], numel)
    both_bugs = ("w0 w1~ w2~", "w1~ w2~", "w1 w2~ w0~", "w1 w2~ w0~", "w1 w2 w0~", "w1 w0~", "w1 w2 w0~", "w1 w0~")
    kept = step(events, [p + s for s in (*both_bugs, "w1 w0~", "w0~", "w0", "")], numel)
    at_start = {n: r.AVAILABLE if n in ("p1", "p2") else r.NOT_AVAILABLE for n in numel}
    steps = [dataclass_replace(s, start=at_start) for s in (recorded, kept)]
    found = r.judge(cfg, steps)
    assert [(v.rule, v.event, v.param, v.legal_under) for v in found] == [
        ("rule-d", 0, "w1", ("live-count-reset",)),
        ("rule-d", 0, "w2", ("live-count-reset",)),
        ("rule-d", 2, "w0", ("live-count-reset",)),
        ("rule-b", 3, "w1", ("prefetch-skip-retention + live-count-reset",)),
    ]
    assert all(not v.legal_under for v in r.judge(cfg, [recorded, kept]))  # nothing gathered at the start


def test_a_recompute_frozen_param_released_by_its_own_modules_is_legal_under_its_relaxation_only():
    """DeepSpeed before PR 8148 (0.19.3; the bug of 002-a) has no ``ds_recompute_parameters``: a reentrant
    recompute of the frozen block B partitions C's frozen ``c`` at its end, C's own backward gathers and
    releases it, while B's backward still runs (measured on 0.18.9: rule-a's drawn example 20 of 0.17.6's
    matrix, shrunk). The rules keep ``c`` until B's backward ends; each early release is legal under
    ``recompute-frozen-unattributed``, the recompute's end under 0.19.8's ``recompute-releases-claimed``
    too.  A coordinator that also skips C's own gather (a second bug) is not explained there."""
    numel = {"c": N, "t": N}
    events = [ev(FWD_PRE, "B", params=[]), ev(FWD_PRE, "C", params=["c"]), ev(FWD_POST, "C", params=["c"])]
    events += [ev(FWD_POST, "B", params=[]), ev(FWD_PRE, "T", params=["t"]), ev(FWD_POST, "T", params=["t"])]
    events += [ev(BWD_PRE, "T", params=["t"]), ev(BWD_POST, "T", params=["t"]), ev(BWD_PRE, "B", params=[])]
    events += [ev(FWD_PRE, "B", True, []), ev(FWD_PRE, "C", True, ["c"]), ev(FWD_POST, "C", True, ["c"])]
    events += [ev(FWD_POST, "B", True, []), ev(BWD_PRE, "C", params=["c"]), ev(BWD_POST, "C", params=["c"])]
    events += [ev(BWD_POST, "B", params=[]), ev(END)]
    cfg = r.Config(numel, reuse_distance=0, prefetch_bucket=0, persistence_threshold=0, frozen=frozenset({"c"}))
    fixed = ["", "c", "", "", "t", "", "t", "", "", "", "c", "c", "c", "c", "c", "", ""]
    assert r.judge(cfg, [step(events, fixed, numel)] * 2) == []
    before_8148 = ["", "c", "", "", "t", "", "t", "", "", "", "c", "", "", "c", "", "", ""]
    found = r.judge(cfg, [step(events, before_8148, numel)])
    both = ("recompute-releases-claimed", "recompute-frozen-unattributed")
    assert [(v.rule, v.event, v.param, v.legal_under) for v in found] == [
        ("rule-a", 11, "c", both),
        ("rule-a", 12, "c", both),
        ("rule-a", 14, "c", ("recompute-frozen-unattributed",)),
    ]
    not_gathered = [s if i != 13 else "" for i, s in enumerate(before_8148)]
    found = r.judge(cfg, [step(events, not_gathered, numel)])
    assert [(v.event, v.legal_under) for v in found if not v.legal_under] == [(13, ())]
