"""The rule family's batch (``fixtures/rule/rule_batch.py``): once per session under xdist, failures saved and
replayed with ``--zero3-replay``, and how the draw follows ``--zero3-*`` and hypothesis's own options."""

import json
import re
import shlex

import pytest
from hypothesis import core
from hypothesis import settings as hsettings
from pytest_zero3.fixtures.rule import rule_batch

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
    assert all(a["ranks"] is None for a in rule_batch.ANCHORS) and len(rule_batch.ANCHORS) <= rule_batch.CHUNK
    one_session = 1
    base = tmp_path / "base"
    two = json.dumps(rule_batch.ANCHORS[:2])  # what the batch holds does not matter here, only how often it runs
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
    pair = json.dumps(rule_batch.ANCHORS[5:7])
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
    example = rule_batch.ANCHORS[6]
    path = rule_batch.save_failure(str(tmp_path), "rule-d", dict(example, ranks=2), "reference")
    assert rule_batch.load_replay(path) == (dict(example, ranks=2),)
    literal = json.dumps({"blocks": ["linear"], "zero": {"stage3_max_reuse_distance": 0}})
    assert rule_batch.load_replay(literal) == (rule_batch.spec(["linear"], {"stage3_max_reuse_distance": 0}),)
    assert len(rule_batch.load_replay(json.dumps(rule_batch.ANCHORS[:2]))) == 2


def test_axes_are_drawn_spelled_one_way_and_put_into_the_config():
    drawn = rule_batch.draw_examples(40, None)
    for axis in rule_batch.AXES:
        assert any(axis in s["axes"] for s in drawn), f"{axis} never drawn in 40 examples"
    assert any(not s["axes"] for s in drawn), "every drawn example has an axis: fp32 is drawn no more"
    assert [s["axes"] for s in drawn] == [[a for a in rule_batch.AXES if a in s["axes"]] for s in drawn]
    literal = json.dumps({"blocks": ["linear"], "zero": {}, "axes": ["zinit", "bf16"]})
    assert rule_batch.load_replay(literal)[0]["axes"] == ["bf16", "zinit"]

    from pytest_zero3.fixtures import profiles
    from pytest_zero3.fixtures.rule import generated

    example = rule_batch.spec(["linear"], {"stage3_prefetch_bucket_size": 20}, axes=["bf16", "offload_param"])
    config = generated.config_of(example, 2)
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_prefetch_bucket_size"] == 20
    assert "offload_optimizer" not in config["zero_optimization"] and config["optimizer"]["params"]["torch_adam"]
    assert generated.tolerance(profiles.dtype_of(config)) == profiles.TOLERANCE["bf16"]
    plain = generated.config_of(rule_batch.spec(["linear"], {}), 2)
    assert "bf16" not in plain and "offload_param" not in plain["zero_optimization"]
    assert generated.tolerance(profiles.dtype_of(plain)) == (generated.PARITY_RTOL, generated.PARITY_ATOL)
    assert "axes: bf16 weights" in generated.reproducer(example)


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
        rule_batch.load_replay(bad)


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
    plan = rule_batch.plan(_settings())
    assert (plan.examples, plan.seed) == (rule_batch.DEFAULT_EXAMPLES, None)


def test_a_user_profile_sets_the_budget_and_zero3_examples_wins(profile):
    profile("zero3-test-many", max_examples=23, derandomize=True)
    assert (rule_batch.plan(_settings()).examples, rule_batch.plan(_settings()).seed) == (23, None)
    assert rule_batch.plan(_settings(examples=3)).examples == 3


def test_a_random_profile_draws_a_fresh_seed_which_the_plan_names(profile):
    profile("zero3-test-random", derandomize=False)
    plan = rule_batch.plan(_settings())
    assert plan.seed is not None and str(plan.seed) in plan.describe()


def test_zero3_seed_wins_over_hypothesis_seed(monkeypatch):
    monkeypatch.setattr(core, "global_force_seed", 11)  # what --hypothesis-seed=11 sets
    assert rule_batch.plan(_settings()).seed == 11
    assert rule_batch.plan(_settings(seed=5)).seed == 5


def test_replay_runs_only_its_examples():
    example = rule_batch.spec(["linear"], {"stage3_max_reuse_distance": 0})
    assert rule_batch.plan(_settings(replay=(example,), examples=50)).specs() == [example]
