"""The rule family's session (``fixtures/pytest_side/rule_*.py``): the batch once per session under xdist,
failures saved and replayed with ``--zero3-replay``, the anchors by name, and how the draw follows
``--zero3-*`` and hypothesis's own options."""

import json
import re
import shlex

import pytest
from hypothesis import core
from hypothesis import settings as hsettings
from pytest_zero3.fixtures.pytest_side import rule_anchors, rule_batch, rule_generation, rule_plan, rule_replay
from pytest_zero3.fixtures.rule import examples as rule_examples

from conftest import BAD
from pytest_zero3 import impl, options


def _settings(**kw) -> options.Settings:
    """Settings as the option table's defaults make them, for the reference, with ``kw`` changed."""
    values = {o.name: o.default for o in options.OPTIONS if o.name != "impl"}
    values.update(timeout=60.0, **kw)
    return options.Settings(impl.parse("reference"), **values)


def _worlds_started(base) -> int:
    """Worlds a session started: each :meth:`World.run` makes one ``run<N>`` directory under its temp dir."""
    return sum(1 for p in base.rglob("run*") if p.is_dir() and re.fullmatch(r"run\d+", p.name))


@pytest.mark.slow
def test_xdist_runs_the_rule_batch_once(run_pytest, tmp_path):
    """Plain ``-n 2`` (``--dist load``) spreads the eight rule tests over both workers; the batch still
    starts exactly the worlds of one serial session (two anchors: one world at the session's size)."""
    anchors = rule_anchors.ANCHORS.values()
    assert all(a["ranks"] is None for a in anchors) and len(anchors) <= rule_batch.CHUNK
    one_session = 1
    base = tmp_path / "base"
    two = json.dumps(
        rule_anchors.named("release-at-forward-end", "window-two-layers-tied")
    )  # what the batch holds does not matter here, only how often it runs
    run = run_pytest(
        "conformance",
        "--zero3-impl=reference",
        "--zero3-select=rule",
        f"--zero3-replay={two}",
        "-n",
        "2",
        f"--basetemp={base}",
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert "8 passed" in run.stdout, run.stdout[-4000:]
    workers = {m for m in re.findall(r"\[(gw\d)\]", run.stdout)} or {p.name for p in base.glob("popen-gw*")}
    assert len(workers) == 2, f"expected two xdist workers, saw {workers}"
    assert _worlds_started(base) == one_session, sorted(str(p) for p in base.rglob("run*"))


@pytest.mark.slow
def test_a_failing_example_is_saved_and_replays(run_suite, run_pytest, tmp_path):
    """The anchor that pins DeepSpeed's live-count reset flags LiveCountReset on rule-d (judged with the
    anchor before it, which passes); the failure saves the example and prints a command that replays
    only it, and the replay fails rule-d again."""
    coordinator = f"{BAD / 'live_count_reset.py'}:LiveCountReset"
    pair = json.dumps(rule_anchors.named("bucket-capped-by-max-live", "eval-keeps-window-gathered"))
    first = run_suite(coordinator, "rule-d", f"--zero3-replay={pair}", f"--basetemp={tmp_path / 'first'}")
    assert first.failed_ids() == {"rule-d"}, first.stdout[-4000:]
    assert "fails in 1 of 2 examples (examples [1]" in first.stdout, first.stdout[-4000:]
    command = re.search(r"^\s*(pytest --zero3-impl=.*--zero3-replay=.*)$", first.stdout, re.M)
    assert command, f"no replay command in the failure:\n{first.stdout[-4000:]}"
    args = shlex.split(command.group(1))[1:]
    saved = json.loads(open(args[-1].split("=", 1)[1]).read())
    assert saved["rule"] == "rule-d" and saved["example"]["eval_at"] == 1, saved

    replay = run_pytest(*args, f"--basetemp={tmp_path / 'replay'}")  # in this process, from the root
    assert replay.failed_ids() == {"rule-d"}, replay.stdout[-4000:]
    assert "fails in 1 of 1 examples" in replay.stdout, replay.stdout[-4000:]
    assert _worlds_started(tmp_path / "replay") == 1  # the example only, not shrunk again


def test_a_bad_replay_is_a_usage_error(run_pytest, tmp_path):
    run = run_pytest("conformance", "--zero3-impl=reference", f"--zero3-replay={tmp_path / 'missing.json'}")
    assert run.returncode == 4, run.stdout[-4000:]
    assert "--zero3-replay: cannot read" in run.stdout, run.stdout[-4000:]


def test_replay_accepts_a_saved_failure_a_bare_example_or_a_list(tmp_path):
    (example,) = rule_anchors.named("eval-keeps-window-gathered")
    path = rule_replay.save_failure(str(tmp_path), "rule-d", dict(example, ranks=2), "reference")
    assert rule_replay.load_replay(path) == (dict(example, ranks=2),)
    literal = json.dumps({"blocks": ["linear"], "zero": {"stage3_max_reuse_distance": 0}})
    assert rule_replay.load_replay(literal) == (rule_examples.spec(["linear"], {"stage3_max_reuse_distance": 0}),)
    assert len(rule_replay.load_replay(json.dumps(list(rule_anchors.ANCHORS.values())[:2]))) == 2


def test_axes_are_drawn_spelled_one_way_and_put_into_the_config():
    drawn = rule_generation.draw_examples(40, None)
    for axis in rule_examples.AXES:
        assert any(axis in s["axes"] for s in drawn), f"{axis} never drawn in 40 examples"
    assert any(not s["axes"] for s in drawn), "every drawn example has an axis: fp32 is drawn no more"
    assert [s["axes"] for s in drawn] == [[a for a in rule_examples.AXES if a in s["axes"]] for s in drawn]
    literal = json.dumps({"blocks": ["linear"], "zero": {}, "axes": ["zinit", "bf16"]})
    assert rule_replay.load_replay(literal)[0]["axes"] == ["bf16", "zinit"]

    from pytest_zero3.fixtures import profiles
    from pytest_zero3.fixtures.rule import generated

    example = rule_examples.spec(["linear"], {"stage3_prefetch_bucket_size": 20}, axes=["bf16", "offload_param"])
    config = rule_examples.config_of(example, 2)
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_prefetch_bucket_size"] == 20
    assert "offload_optimizer" not in config["zero_optimization"] and config["optimizer"]["params"]["torch_adam"]
    assert generated.tolerance(profiles.dtype_of(config)) == profiles.TOLERANCE["bf16"]
    plain = rule_examples.config_of(rule_examples.spec(["linear"], {}), 2)
    assert "bf16" not in plain and "offload_param" not in plain["zero_optimization"]
    assert generated.tolerance(profiles.dtype_of(plain)) == (rule_examples.PARITY_RTOL, rule_examples.PARITY_ATOL)
    assert "axes: bf16 weights" in rule_examples.reproducer(example)


@pytest.mark.parametrize(
    "bad, says",
    [
        ('{"blocks": ["conv"], "zero": {}}', "'blocks' must be"),
        ('{"blocks": ["linear"], "zero": {}, "colour": 1}', "unknown example fields ['colour']"),
        ('{"blocks": ["linear"], "zero": {}, "frozen": [3]}', "'frozen' must list block indices below 1"),
        ('{"blocks": ["linear"], "zero": {"stage3_max_reuse_distance": 0.5}}', "'zero' maps ZeRO config keys"),
        ('{"blocks": ["linear"], "zero": {"stage3_colour": 1}}', "'zero' sets ['stage3_colour'], which the rule"),
        ('{"blocks": ["linear"], "zero": {}, "axes": ["fp8"]}', "'axes' must list distinct names of"),
        ('{"blocks": ["linear"], "zero": {}, "axes": "bf16"}', "'axes' must list distinct names of"),
        ('{"blocks": ["linear"], "zero": {}, "axes": ["bf16", "bf16"]}', "'axes' must list distinct names of"),
        ("[]", "holds no example"),
        ("{not json", "is not JSON"),
    ],
)
def test_replay_names_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        rule_replay.load_replay(bad)


@pytest.fixture
def profile():
    """Load a hypothesis profile for one test (as ``--hypothesis-profile`` does), then the default again."""
    before = hsettings.get_current_profile_name()

    def load(name, **kw):
        hsettings.register_profile(name, **kw)
        hsettings.load_profile(name)

    yield load
    hsettings.load_profile(before)


def test_plan_defaults_to_the_derandomised_ci_budget():
    plan = rule_plan.plan(_settings())
    assert (plan.examples, plan.seed) == (rule_plan.DEFAULT_EXAMPLES, None)


def test_a_user_profile_sets_the_budget_and_zero3_examples_wins(profile):
    profile("zero3-test-many", max_examples=23, derandomize=True)
    assert (rule_plan.plan(_settings()).examples, rule_plan.plan(_settings()).seed) == (23, None)
    assert rule_plan.plan(_settings(examples=3)).examples == 3


def test_a_random_profile_draws_a_fresh_seed_which_the_plan_names(profile):
    profile("zero3-test-random", derandomize=False)
    plan = rule_plan.plan(_settings())
    assert plan.seed is not None and str(plan.seed) in plan.describe()


def test_zero3_seed_wins_over_hypothesis_seed(monkeypatch):
    monkeypatch.setattr(core, "global_force_seed", 11)  # what --hypothesis-seed=11 sets
    assert rule_plan.plan(_settings()).seed == 11
    assert rule_plan.plan(_settings(seed=5)).seed == 5


def test_replay_runs_only_its_examples():
    example = rule_examples.spec(["linear"], {"stage3_max_reuse_distance": 0})
    assert rule_plan.plan(_settings(replay=(example,), examples=50)).specs() == [example]


def test_anchors_are_named_and_cited_by_name():
    """Why: the flag table and the proofs cite an anchor by its name, which must not move when an anchor
    is added; an unknown name is an error that lists the known ones, not an empty replay."""
    from flags import CASES

    cited = {name for case in CASES for name in case.anchors}
    assert cited <= set(rule_anchors.ANCHORS), cited - set(rule_anchors.ANCHORS)
    assert all(rule_replay.check_example(a) == a for a in rule_anchors.ANCHORS.values())
    with pytest.raises(KeyError, match="release-at-forward-end"):
        rule_anchors.named("no-such-anchor")
