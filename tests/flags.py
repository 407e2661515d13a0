"""The proof table: every known-bad coordinator, the bug it puts back, and the contract IDs that must flag it.

One entry per coordinator in ``tests/bad_coordinators/``.  ``tests/test_flags.py`` runs the suite
against each entry and checks the outcome; ``docs/gen.py`` renders the manual's proof table from
the same entries.  To add a coordinator, add one :class:`Case`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from pytest_zero3 import registry


def family(name: str, *, but: tuple = ()) -> frozenset[str]:
    """Every registered ID of family ``name`` (less ``but``)."""
    return frozenset(cid for cid, c in registry.load().items() if c.family == name and cid not in but)


@dataclasses.dataclass(frozen=True)
class Case:
    coordinator: str  # "file.py:Class" in tests/bad_coordinators/
    bug: str  # one line, for the manual's proof table
    flagged: frozenset[str]  # must FAIL
    select: str  # --zero3-select of the run ("" = the whole suite)
    may_fail: frozenset[str] = frozenset()  # may FAIL too (their scenario exercises the same bug); nothing else may
    must_pass: frozenset[str] = frozenset()  # must pass (the bug cannot show there)
    check: Callable | None = None  # extra assertions on the tests.conftest.Run
    extra: tuple = ()  # more pytest arguments for the run
    anchors: tuple = ()  # names of the anchors that catch the bug (rule_anchors.ANCHORS): the bite replays only these

    @property
    def name(self) -> str:
        return self.coordinator.split(".py:")[0]


def _diverges_without_hanging(run) -> None:
    assert "ranks are about to issue different all-gathers" in run.stdout or "ranks differ" in run.stdout, (
        f"003-b failed without showing the diverging sequences:\n{run.stdout[-4000:]}"
    )
    assert "still running after" not in run.stdout, f"003-b caught the divergence only as a hang:\n{run.stdout[-4000:]}"


def _fp32_passes_but(profile: str, cid: str):
    """The bug shows only under ``profile``: contract ``cid`` (no variants) passes under fp32 (the control)."""

    def check(run) -> None:
        test = f"test_contract[{cid}"
        assert f"{test}-fp32] PASSED" in run.stdout, f"{cid} must pass under fp32:\n{run.stdout[-4000:]}"
        assert f"{test}-{profile}] FAILED" in run.stdout, f"{cid} must fail under {profile}:\n{run.stdout[-4000:]}"

    return check


def _trains_silently_wrong(run) -> None:
    text = "after training: weight model.embed_tokens.weight: "
    assert text in run.stdout, f"007-d failed, but not by the resized embedding's weights:\n{run.stdout[-4000:]}"


#: The coordinator families (004 judges DeepSpeed's save path, not the coordinator), the rule family on
#: its fixed anchors only and unshrunk: the flag tests need the IDs, not a reproducer.
COORDINATOR_FAMILIES = "000,001,002,003,base,rule"
ANCHORS_ONLY = ("--zero3-examples=0", "--zero3-shrink=0")

CASES = (
    # family 000 (DeepSpeed PR 9003)
    Case(
        "prefetch_skip_retention.py:PrefetchSkipRetention",
        "PR 9003: prefetch-skipped params kept until their next (backward) use",
        frozenset({"000-a"}),
        COORDINATOR_FAMILIES,
        may_fail=family("000") | {"rule-b", "rule-f"},
        extra=ANCHORS_ONLY,
    ),
    # Every family-000 contract that configures a non-zero distance fails; 000-a, 000-c and 000-f run at
    # distance 0 and 000-g compares losses only.
    Case(
        "ignores_reuse_distance.py:IgnoresReuseDistance",
        "never keeps a param for reuse",
        frozenset({"000-b", "000-d", "000-e"}),
        "000",
        must_pass=frozenset({"000-a", "000-c"}),
    ),
    # family 001 (DeepSpeed PR 8883)
    Case(
        "class_level_cache.py:ClassLevelCacheCoordinator",
        "PR 8883: `lru_cache` on the release-set method",
        frozenset({"001-a"}),
        "001",
    ),
    Case(
        "stale_cache_after_retrace.py:StaleCacheAfterRetraceCoordinator",
        "release cache not cleared when the trace is re-recorded",
        frozenset({"001-b"}),
        "001",
    ),
    Case(
        "mutated_release_set.py:MutatedReleaseSetCoordinator",
        "backward adds recompute params into a cached forward release set",
        frozenset({"001-c"}),
        "001",
    ),
    # family 002 (DeepSpeed PRs 8130/8148); base-f checks a checkpointed model with frozen params, so the
    # bug legitimately breaks it too; 002-d recomputes no frozen param.
    Case(
        "partition_frozen_during_recompute.py:PartitionFrozenDuringRecompute",
        "PR 8130: frozen params partitioned during checkpoint recompute",
        frozenset({"002-a"}),
        COORDINATOR_FAMILIES,
        may_fail=family("002") | family("rule") | {"base-f"},
        must_pass=frozenset({"002-d"}),
        extra=ANCHORS_ONLY,
    ),
    # family 003 (DeepSpeed PR 8431)
    Case(
        "rank_local_adaptive.py:RankLocalAdaptiveCoordinator",
        "PR 8431 review: each rank decides the bucket from its own clock",
        frozenset({"003-b"}),
        "003",
        check=_diverges_without_hanging,
    ),
    Case(
        "adaptive_unclamped_start.py:UnclampedStart",
        "start value outside the bounds never clamped",
        frozenset({"003-c"}),
        "003",
    ),
    Case(
        "adaptive_samples_while_recording.py:SamplesWhileRecording",
        "samples taken while the trace is recorded",
        frozenset({"003-d"}),
        "003",
    ),
    Case(
        "adaptive_keep_samples_across_invalidation.py:KeepSamplesAcrossInvalidation",
        "samples kept across a trace invalidation",
        frozenset({"003-d"}),
        "003",
    ),
    # With one decision per pass the inverted controller cannot reach 003-c's lower bound within that
    # scenario's two wait steps either.
    Case(
        "adaptive_inverted_controller.py:InvertedController",
        "grows without waits, shrinks with long ones",
        frozenset({"003-f"}),
        "003",
        may_fail=frozenset({"003-c"}),
    ),
    # family base: bookkeeping bugs change no number, so every parity contract must still pass
    Case(
        "never_rerecord.py:NeverRerecord",
        "never re-records after the trace is invalidated",
        frozenset({"base-g"}),
        "base",
    ),
    Case(
        "keeps_recompute_attribution.py:KeepsRecomputeAttribution",
        "`ds_recompute_parameters` never emptied",
        frozenset({"base-f"}),
        "base",
    ),
    # stale weights break every parity contract; base-f checks bookkeeping, not numbers.  base-e may fail
    # too: the class is DeepSpeed 0.19.8's own coordinator, whose persistent params are released while the
    # first trace is recorded (DeepSpeed bug 12), which base-e reads inside the step.
    Case(
        "stale_gather_cache.py:StaleGatherCache",
        "DeepSpeed's coordinator serving stale gathered copies",
        frozenset({"base-a", "base-b", "base-c", "base-d", "base-g", "base-h", "base-i", "base-j"}),
        "base",
        may_fail=frozenset({"base-e"}),
    ),
    # profile hpz: only a world with secondary shards can show it; base-e (fp32 only) is the control
    Case(
        "hpz_mixed_gather.py:HpzMixedGather",
        "hpZ: params with and without a secondary shard all-gathered in one call",
        frozenset({"base-f"}),
        "base-e,base-f",
        check=_fp32_passes_but("hpz", "base-f"),
        extra=("--zero3-profile=fp32,hpz", "-v"),
    ),
    # family rule: each a realistic mistake the hand-written contracts miss (exactly these IDs fail)
    Case(
        "backward_defers_release.py:BackwardDefersRelease",
        "backward releases left to the end-of-backward cleanup",
        frozenset({"rule-b", "rule-f"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("window-two-layers-tied",),
    ),
    Case(
        "prefetch_counts_shards.py:PrefetchCountsShards",
        "prefetch bucket filled with per-rank shard sizes",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("release-at-forward-end",),
    ),
    # axis bf16: exact at fp32, so every hand-written contract and every fp32 anchor passes; only the
    # rule family's bf16 anchor shows it
    Case(
        "prefetch_bucket_in_bytes.py:PrefetchBucketInBytes",
        "prefetch bucket budgeted in bytes at 4 per element (twice the bucket at bf16)",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("bf16-offload-bucket",),
    ),
    Case(
        "prefetch_ignores_max_live.py:PrefetchIgnoresMaxLive",
        "`stage3_max_live_parameters` never applied to prefetch",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("bucket-capped-by-max-live",),
    ),
    Case(
        "partitions_persistent_in_backward.py:PartitionsPersistentInBackward",
        "backward release drops the persistent-param exception",
        # base-e reads persistence after the backward too: a persistent param released there breaks it
        frozenset({"rule-e", "rule-f", "base-e"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("persistent-biases",),
    ),
    Case(
        "backward_window_off_by_one.py:BackwardWindowOffByOne",
        "backward reuse scan uses `>` instead of `>=`",
        frozenset({"rule-b", "rule-f"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("window-two-layers-tied",),
    ),
    Case(
        "live_count_reset.py:LiveCountReset",
        "live-parameter count zeroed at each pass while params stay gathered (DeepSpeed 0.19.8's `reset_step`)",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("eval-keeps-window-gathered",),
    ),
    Case(
        "stale_external_params.py:StaleExternalParams",
        "an external param's first gathered copy served on later fetches",
        frozenset({"rule-h"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("external-param-accumulation",),
    ),
    Case(
        "prefetch_charges_gathered.py:PrefetchChargesGathered",
        "params already gathered charged against the prefetch bucket",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("release-at-forward-end",),
    ),
    Case(
        "no_prefetch_in_eval.py:NoPrefetchInEval",
        "no prefetch while the fetched module is in eval mode",
        frozenset({"rule-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("eval-keeps-window-gathered",),
    ),
    Case(
        "trace_warnings_always.py:TraceWarningsAlways",
        "`log_trace_cache_warnings` ignored: every trace invalidation warned",
        frozenset({"base-k"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
    ),
    Case(
        "trace_past_end.py:TracePastEnd",
        "a pass longer than the recorded trace indexes past its end",
        frozenset({"rule-a"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("eval-trace-then-longer-pass",),
    ),
    # the re-recorded trace starts with the stale half: it stops matching at the first backward (rule-g), and
    # until then prefetch and the reuse window follow it (rule-c/d/f)
    Case(
        "keeps_half_recorded_pass.py:KeepsHalfRecordedPass",
        "a trace invalidated while it is being recorded keeps the half-recorded pass",
        frozenset({"rule-c", "rule-d", "rule-f", "rule-g"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("rehook-while-recording",),
    ),
    Case(
        "inflight_after_divergence.py:InflightAfterDivergence",
        '"still have inflight params" after a pass that diverged from the trace with prefetches in flight',
        frozenset({"rule-a"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("routing-diverges-from-trace",),
    ),
    Case(
        "backward_in_eval_mode.py:BackwardInEvalMode",
        '"backward pass is invalid for module in evaluation mode" for a submodule in eval() while training',
        frozenset({"rule-a", "zoo-e"}),  # zoo-e: LLaVA's projector trains in eval(); the other models pass
        COORDINATOR_FAMILIES + ",zoo",
        extra=ANCHORS_ONLY,
        anchors=("routing-diverges-from-trace",),
    ),
    Case(
        "keeps_returned_params.py:KeepsReturnedParams",
        "a param a module returns from its forward never released by a hook (DeepSpeed 0.19.8's skip)",
        frozenset({"rule-b", "rule-f"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
        anchors=("returned-param",),
    ),
    # the gc-object census of 001-d misses it; the retained-memory bound (tracemalloc) catches it
    Case(
        "grows_fetch_log.py:GrowsFetchLog",
        "a log of int tuples that is never trimmed",
        frozenset({"001-d"}),
        COORDINATOR_FAMILIES,
        extra=ANCHORS_ONLY,
    ),
    # family 006 (cost in counts): the bug leaves every fetch, release and number as the reference's, so
    # every other contract passes (measured: 000, 001, 002, base, rule on its anchors and 005 too)
    Case(
        "checks_every_pass.py:ChecksEveryPass",
        "cross-rank order check at every step over every pass so far (a history never trimmed)",
        frozenset({"006-a"}),
        COORDINATOR_FAMILIES + ",006",
        extra=ANCHORS_ONLY,
    ),
    Case(
        "releases_prefetched.py:ReleasesPrefetched",
        "every release also partitions the params prefetched for later modules (a refetch storm)",
        frozenset({"006-a"}),
        "006",
        may_fail=frozenset({"006-b"}),  # each refetch walks the rest of the trace: work per pass grows too
    ),
    Case(
        "release_scan_uncached.py:ReleaseScanUncached",
        "release sets recomputed at every release: each scans the trace up to the next use",
        frozenset({"006-b"}),
        COORDINATOR_FAMILIES + ",006",
        extra=ANCHORS_ONLY,
    ),
)

# family 005 (the engine around the coordinator); the forks of its other contracts: tests/test_flags_005.py
CASES += (
    Case(
        "leaves_gathers_in_flight.py:LeavesGathersInFlight",
        "`GatheredParameters` opened between a forward and its backward leaves the backward's prefetches in "
        "flight (stock 0.19.8's): read empty inside, 'Cannot partition a param in flight' on exit",
        frozenset({"005-f"}),
        COORDINATOR_FAMILIES + ",005",
        extra=ANCHORS_ONLY,
    ),
)

# family 007 (the model's life around the engine); the forks of 007's other contracts: tests/test_flags_007.py
CASES += (
    Case(
        "resident_reads_plain_params.py:ResidentReadsPlainParams",
        "the resident-param count reads `ds_status` of every param, also of a module attached after "
        "`deepspeed.initialize` (the reference before 007-a; DeepSpeed's test_zero_late_module_attach.py)",
        frozenset({"007-a"}),
        COORDINATOR_FAMILIES + ",007",
        # a param replaced after initialize is a plain param too: 007-d's first forward meets the same read
        may_fail=frozenset({"007-d"}),
        extra=ANCHORS_ONLY,
    ),
    Case(
        "hides_plain_params.py:HidesPlainParams",
        "a module's fetch and release leave out its plain params (the obvious fix of the `ds_id` crash after "
        "`resize_token_embeddings`): the resized embedding runs untrained where plain torch trains it",
        frozenset({"007-d"}),
        COORDINATOR_FAMILIES + ",007",
        check=_trains_silently_wrong,
        extra=ANCHORS_ONLY,
    ),
)

#: A bug only dynamo's trace of a compiled-autograd backward shows: 008-m under compile flags it, its fp32
#: variant (dynamo disabled, the captured graph run as captured) is the control that lets it through.
_COMPILED_AUTOGRAD_ONLY = dict(
    flagged=frozenset({"008-m"}),
    select="008",
    check=_fp32_passes_but("compile", "008-m"),
    extra=("--zero3-profile=fp32,compile", "-v"),
)

# family 008 (the public surface); the forks of its tensor-fragment contracts: tests/test_flags_008.py
CASES += (
    Case(
        "ipg_buffer_one_short.py:IpgBufferOneShort",
        "the contiguous gradient bucket allocated one element short of `reduce_bucket_size`: a bucket filled "
        "exactly to the size writes past it (shows only at a size a backward fills exactly, as HF's `auto` does)",
        frozenset({"008-f"}),
        COORDINATOR_FAMILIES + ",008",
        extra=ANCHORS_ONLY,
    ),
    # profile compile: under fp32 008-m compiles with dynamo disabled (capture only), the control
    Case(
        "traced_grad_hooks.py:TracedGradHooks",
        "stage 3's gradient hooks left for compiled autograd to trace: dynamo's fake partitioned param fails "
        "the hook's shape assertion in the first backward (`engine.compile(compiled_autograd_enabled=True)`)",
        **_COMPILED_AUTOGRAD_ONLY,
    ),
    Case(
        "compiled_fetch_unchecked.py:CompiledFetchUnchecked",
        "the fetch trusts the trace a compiled backward never checked: trace_prologue is a no-op in code "
        "dynamo traced, and a two-module model's first compiled backward fetches past the trace's end",
        **_COMPILED_AUTOGRAD_ONLY,
    ),
)
