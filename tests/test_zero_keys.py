"""The rule family's ZeRO config space (``fixtures/rule/zero_keys.py``): keys read from the implementation's
source, each drawn from its domain or declared with a reason, and the known-bad forks only a drawn key
exposes.

The reader is judged without a world (it must work in pytest's process, which imports no deepspeed);
the family is judged on a few drawn examples at one world size, against the reference (passes) and
against two fork copies of the installed deepspeed with one edit each (flagged only where the key is
drawn).
"""

import functools
import json
import re
import shutil

import pytest
from forks import copy_installed_deepspeed, edit
from pytest_zero3.fixtures.config import ABOVE_ANY_MODEL
from pytest_zero3.fixtures.pytest_side import rule_anchors, rule_generation, rule_plan
from pytest_zero3.fixtures.rule import examples as rule_examples
from pytest_zero3.fixtures.rule import zero_keys

from conftest import ROOT
from pytest_zero3 import impl


def _installed() -> str:
    return impl.describe_without_import(impl.parse("installed"))["deepspeed_path"]


@functools.lru_cache(maxsize=1)
def _drawn() -> list:
    """40 examples drawn with the installed deepspeed's keys (derandomised: the same on every run)."""
    keys, _ = rule_plan.key_table(impl.parse("installed"))
    return rule_generation.draw_examples(40, None, keys)


def test_the_reader_finds_the_installed_keys_their_aliases_types_and_defaults(monkeypatch):
    fields = zero_keys.read_fields(_installed())
    bucket = fields["stage3_prefetch_bucket_size"]
    assert (bucket.name, bucket.annotation, bucket.default, bucket.least) == (
        "prefetch_bucket_size",
        "int",
        5 * 10**7,
        0,
    )
    assert fields["stage3_max_reuse_distance"].name == "max_reuse_distance"
    assert fields["stage3_use_all_reduce_for_fetch_params"].default is False
    assert fields["reduce_bucket_size"].least == 1  # Field(..., gt=0)
    assert fields["overlap_comm"].annotation == "Optional[bool]" and fields["overlap_comm"].default is None
    assert fields["cpu_offload"].deprecated and not fields["sub_group_size"].deprecated

    table = zero_keys.table(_installed(), gpu=False)
    drawn, declared = set(table.keys()), dict(table.declared)
    assert set(fields) == drawn | set(declared) and not table.unknown and not table.missing, table
    for key in ("reduce_bucket_size", "stage3_module_granularity_threshold", "zero_hpz_partition_size"):
        assert key in drawn
    assert declared["zero_quantized_weights"].startswith("unsupported on CPU: ")
    assert "stage 3 ignores it" in declared["round_robin_gradients"]
    # scripts/gpu-check.sh lifts the CPU-only exclusions through the environment
    monkeypatch.setenv(zero_keys.GPU_ENV, "1")
    assert "zero_quantized_weights" in zero_keys.table(_installed()).keys()
    assert f"{zero_keys.GPU_ENV}=1" in (ROOT / "scripts" / "gpu-check.sh").read_text()


@pytest.fixture
def fork_config(tmp_path):
    """A fork whose ZeRO config model lacks ``stage3_use_all_reduce_for_fetch_params`` and adds a key of
    its own (only the files the reader and the plan read: the config model and the package marker)."""
    src = zero_keys.config_file(_installed())
    dest = tmp_path / "deepspeed" / "runtime" / "zero" / "config.py"
    dest.parent.mkdir(parents=True)
    (tmp_path / "deepspeed" / "__init__.py").write_text("")
    shutil.copy(src, dest)
    edit(
        str(tmp_path),
        "runtime/zero/config.py",
        '    use_all_reduce_for_fetch_params: bool = Field(False, alias="stage3_use_all_reduce_for_fetch_params")\n',
        '    fork_prefetch_mode: Literal["eager", "lazy"] = Field("eager", alias="stage3_fork_prefetch_mode")\n',
    )
    return tmp_path


def test_a_key_the_fork_lacks_is_declared_missing_and_never_drawn(fork_config):
    table = zero_keys.table(str(fork_config / "deepspeed"), gpu=False)
    assert table.missing == ("stage3_use_all_reduce_for_fetch_params",)
    assert table.unknown == ("stage3_fork_prefetch_mode",)  # a fork's own key: shown, not drawn
    keys, text = rule_plan.key_table(impl.parse(str(fork_config)))
    assert "missing in this implementation, not drawn: stage3_use_all_reduce_for_fetch_params" in text
    assert "unknown to the suite, not drawn: stage3_fork_prefetch_mode" in text
    assert zero_keys.header(str(fork_config / "deepspeed")) == (
        "ZeRO keys unknown to the rule family, not drawn: stage3_fork_prefetch_mode; "
        "missing in this implementation, not drawn: stage3_use_all_reduce_for_fetch_params"
    )
    assert zero_keys.header(_installed()) is None  # the report header says nothing where nothing differs
    drawn = rule_generation.draw_examples(24, None, keys)
    seen = {k for s in drawn for k in s["zero"]}
    assert "stage3_use_all_reduce_for_fetch_params" not in seen and "stage3_fork_prefetch_mode" not in seen
    assert {"reduce_bucket_size", "zero_hpz_partition_size", "stage3_module_granularity_threshold"} <= seen


def test_the_draw_spans_each_domain_and_is_legal_where_it_runs():
    drawn = _drawn()
    extra = {k for s in drawn for k in s["zero"] if k not in rule_examples.CORE}
    assert extra == set(zero_keys.table(_installed(), gpu=False).keys()) - set(rule_examples.CORE), extra
    for s in drawn:
        zero = rule_examples.config_of(s, s["ranks"])["zero_optimization"]
        hpz = zero.get("zero_hpz_partition_size", 1)
        assert hpz != 1 or "zero_hpz_partition_size" not in s["zero"], "hpZ drawn at its default"
        assert s["ranks"] % hpz == 0
        assert zero.get("stage3_module_granularity_threshold", 0) < rule_examples.root_granularity(s)
        assert zero.get("reduce_bucket_size", 1) >= 1
    # at most ABOVE_ANY_MODEL: stage 3 allocates its gradient bucket at full size, and every run fills it
    assert max(zero_keys.choices("reduce_bucket_size", "size", 8, 2)) == ABOVE_ANY_MODEL
    # replayed at another size (a shrink to fewer ranks), a partition size is cut to a divisor
    example = rule_examples.spec(["linear"], {"zero_hpz_partition_size": 4}, ranks=4)
    assert rule_examples.config_of(example, 2)["zero_optimization"]["zero_hpz_partition_size"] == 2
    assert rule_examples.config_of(example, 3)["zero_optimization"]["zero_hpz_partition_size"] == 1


def _covering(n: int) -> list:
    """``n`` drawn examples that set the most drawn keys between them, run at 2 ranks and 3 steps."""
    drawn = _drawn()
    picked, seen = [], set()
    for _ in range(n):
        best = max(drawn, key=lambda s: len(set(s["zero"]) - seen))
        picked.append(dict(best, ranks=2, steps=3))
        seen |= set(best["zero"])
    return picked


@pytest.mark.slow
def test_the_reference_passes_examples_with_drawn_keys(run_suite):
    examples = _covering(3)
    assert len({k for s in examples for k in s["zero"]} - set(rule_examples.CORE)) >= 9, examples
    run = run_suite("reference", "rule", f"--zero3-replay={json.dumps(examples)}")
    assert run.returncode == 0 and "8 passed" in run.stdout, run.stdout[-4000:]


#: Fork copies of the installed deepspeed, each with one edit that only a drawn key reaches:
#: name -> (edit, the key's example, the contract that flags it).
KEY_BUGS = {
    # DeepSpeed PR 8158 undone: the all-reduce fetch walks its flat buffer by each param's unaligned numel,
    # so a padded param's partition padding is summed into the next param's first elements
    "all_reduce_fetch_stride": (
        (
            "runtime/zero/partition_parameters.py",
            "                    start_param += param.ds_numel_aligned\n",
            "                    start_param += param.ds_numel\n",
        ),
        {"stage3_use_all_reduce_for_fetch_params": True},
        "rule-h",
    ),
    # the reduce-scatter's lone-gradient fast path taken for uneven gradients too (family 005's
    # lone_uneven_gradient_unpadded): reached when reduce_bucket_size is below one param
    "lone_uneven_gradient_unpadded": (
        (
            "runtime/comm/coalesced_collectives.py",
            "if len(tensors) == 1 and tensors[0].numel() % world_sz == 0:",
            "if len(tensors) == 1:",
        ),
        {"reduce_bucket_size": 7},
        "rule-a",
    ),
}


@pytest.fixture(scope="module")
def key_fork(tmp_path_factory):
    """One fork copy with every edit of :data:`KEY_BUGS` (each reached only by its own key)."""
    fork = copy_installed_deepspeed(str(tmp_path_factory.mktemp("fork-keys")))
    for (relpath, old, new), *_ in KEY_BUGS.values():
        edit(fork, relpath, old, new)
    return fork


@pytest.mark.proof  # intermittent in CI: see the last paragraph
@pytest.mark.slow
def test_a_bug_only_a_drawn_key_reaches_is_flagged(run_suite, key_fork):
    """Why: every profile and anchor runs these forks green; Linear(8, 8) layers at 3 ranks have padded
    partitions (64 and 8 elements over 3), and only the drawn key takes the broken path.  Each bug's
    examples with its key fail its contract; the same model without any drawn key passes both.

    The all-reduce bug adds a partition's padding, which DeepSpeed allocates uninitialised, so with
    ``--zero3-poison=off`` it shows only where the allocator hands back dirty memory (measured: 10 of 12
    examples, and none of three in one CI run); poisoned (the default) the padding is NaN and each key's
    example fails its contract on every run, in exactly its own examples.

    Judged as a fork gate judges: under 0.19.8's expectations, beside the anchor of a stock bug listed
    there for rule-a (checkpoint early stop off): that known failure must not hide the new one.

    Not in CI: in one of four clean-clone CI runs on 2026-12-04 rule-h passed the all-reduce fork's
    example even poisoned (3 of 3 alone, and every run of the day before, flagged
    it), so the NaN does not reach that example's padding on every run; the cause is not found yet.
    The proof run (scripts/proofs.sh) keeps it."""
    base = rule_examples.spec(
        ["linear"] * 2,
        {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 10**9, "stage3_param_persistence_threshold": 0},
        width=8,
        ranks=3,
        steps=3,
    )
    known = dict(
        rule_anchors.ANCHORS["checkpoint-frozen-no-early-stop"], ranks=3
    )  # rule-a on stock 0.19.8, listed in its expectations
    assert known["early_stop"] is False
    examples, expect = [known], {"rule-a": {0}}
    for _, key, rule in KEY_BUGS.values():
        expect.setdefault(rule, set()).add(len(examples))
        examples.append(dict(base, zero={**base["zero"], **key}))
    examples.append(base)
    listed = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    replay = f"--zero3-replay={json.dumps(examples)}"
    run = run_suite(key_fork, ",".join(sorted(expect)), replay, "--zero3-shrink=0", f"--zero3-expect={listed}")
    assert run.failed_ids() == set(expect), run.stdout[-4000:]
    lone = sorted(expect["rule-a"] - {0})
    assert f"The cause --zero3-expect lists for rule-a explains 1 of them; not: {lone}." in run.stdout, run.stdout[
        -4000:
    ]
    for rule, indices in expect.items():
        found = re.search(rf"{rule} \(.*?\) fails in \d+ of \d+ examples \(examples \[([\d, ]+)\]", run.stdout)
        assert found, run.stdout[-4000:]
        failing = {int(i) for i in found.group(1).split(",")}
        assert failing == indices, f"{rule} fails in {sorted(failing)}, its key's examples are {sorted(indices)}"


@pytest.mark.proof
def test_the_drawn_examples_flag_the_key_fork_and_nothing_else(run_suite, key_fork):
    """Why: the bite above replays the examples that reach each bug; here the family's own draw (32
    examples, derandomised, 0.19.8's expectations for the stock bugs) must find the lone uneven
    gradient (rule-a) and fail nothing but rule-a and rule-h (the all-reduce stride shows in rule-h
    where the draw puts the key at 3 ranks and the padding is not zero)."""
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    run = run_suite(key_fork, "rule", "--zero3-examples=32", "--zero3-shrink=0", f"--zero3-expect={expect}")
    failed = run.failed_ids()
    assert "rule-a" in failed and failed <= {"rule-a", "rule-h"}, run.stdout[-4000:]
    assert "the step raised" in run.stdout, run.stdout[-4000:]
