"""The seq family (``fixtures/seq/``, contract seq-a): the draw, its pairs, replay, the report's pair line,
and the known-bads only pairs reach (tests/forks.py), flagged with a shrunk reproducer that replays."""

import ast
import json
import re

import pytest
from pytest_zero3.fixtures.seq import space

from conftest import ROOT
from pytest_zero3 import options, report


def test_the_draw_is_derandomised_and_follows_the_seed():
    """Why: CI must judge the same examples on every run; ``--zero3-seed`` draws others, replayably."""
    assert space.draw_examples(6, None) == space.draw_examples(6, None)
    assert space.draw_examples(6, 3) == space.draw_examples(6, 3) != space.draw_examples(6, None)
    for example in space.draw_examples(12, None):
        assert space.check_example(example) == example
        assert example["actions"][0] == ["train", {}]  # reads and files need a step behind them
        size = example["zero"].get("reduce_bucket_size")
        assert size is None or size in space.boundaries(example["features"]), example


def test_a_week_of_date_seeds_draws_every_pair_and_each_day_replays_by_its_number():
    """Why (issue 54, item 3): CI judges one fixed draw; a nightly ``--zero3-seed=date`` draws anew each
    day, and over a week of them (Monday to Sunday) the default budget reaches every pair the space
    allows (a budget of 64 all of them in one run), each day's draw the one its printed number replays."""
    import datetime

    today = options._seed("date")
    assert today == int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d"))
    assert options._seed(str(today)) == today
    with pytest.raises(ValueError, match="'date'"):
        options._seed("tomorrow")
    anchors = [dict(e) for e in space.ANCHORS]
    allowed = sum(len(v) for v in space.allowed_pairs().values())
    n = space.DEFAULT_EXAMPLES
    for monday in (datetime.date(2026, 12, 7), datetime.date(2027, 2, 22)):  # fixed weeks: the draw's figure
        seeds = [int((monday + datetime.timedelta(d)).strftime("%Y%m%d")) for d in range(7)]
        days = [space.draw_examples(n, s) for s in seeds]
        assert all(len(day) == n for day in days)
        for example in (e for day in days for e in day):
            assert space.check_example(example) == example
        week = space.coverage(anchors + [e for day in days for e in day])
        assert sum(v["drawn"] for v in week.values()) == allowed, {k: v["drawn"] for k, v in week.items()}
        one_day = space.coverage(anchors + days[3])
        assert sum(v["drawn"] for v in one_day.values()) < allowed
        space.week_plan.cache_clear()
        assert space.draw_examples(n, seeds[3]) == days[3]  # replayed from its number alone
        whole = space.draw_examples(64, seeds[3])  # a nightly budget: the whole plan in one run
        assert sum(v["drawn"] for v in space.coverage(anchors + whole).values()) == allowed
    assert space.day_share(12345) == [] and space.date_of(20261232) is None  # any other seed: drawn only


def test_sizes_are_drawn_at_the_models_own_boundaries():
    """Why: bucket and partition arithmetic has its edges at a param's numel, one off, and a layer's grads."""
    assert space.boundaries([]) == [3, 4, 5, 15, 16, 17, 20]
    assert space.boundaries(["odd", "tiny"]) == [1, 2, 4, 5, 6, 24, 25, 26, 30]


def test_pairs_are_counted_against_all_the_space_allows():
    """Why (issue 54, item 3): the report says how much of the pair space a run reached."""
    allowed = space.allowed_pairs()
    options_ = sum(len(v) for opts in space.ACTIONS.values() for v in opts.values())
    assert len(allowed["feature x action"]) == len(space.FEATURES) * len(space.ACTIONS)
    assert len(allowed["action x option"]) == options_
    assert len(allowed["option x config key"]) == options_ * (len(space.ZERO_KEYS) + len(space.TOP_KEYS))
    example = space.spec(
        ["tied"], {"reduce_scatter": False}, {}, [["train", {}], ["fp32", {"exclude_frozen_parameters": True}]]
    )
    got = space.coverage([example])
    assert got["feature x action"]["pairs"] == ["tied | fp32", "tied | train"]
    assert got["option x config key"]["pairs"] == ["fp32.exclude_frozen_parameters=true | reduce_scatter"]
    line = report.pairs_line({k: {**v, "drawn": len(v["pairs"])} for k, v in got.items()})
    assert re.fullmatch(r"pairs drawn \(seq family\): 4 of \d+ \(feature x action 2/\d+, .*\); .*", line), line


def test_the_pairs_field_is_in_the_report_schema():
    from test_report import render_matrix

    schema = json.loads((ROOT / "pytest_zero3" / "report.schema.json").read_text())
    pairs = {k: {"drawn": len(v["pairs"]), **v} for k, v in space.coverage(space.ANCHORS).items()}
    assert render_matrix().validate(pairs, schema["properties"]["pairs"]) == []


def test_replay_takes_seq_examples_and_leaves_rule_ones_to_the_rule_family(tmp_path):
    """Why: one ``--zero3-replay`` option for both generated families; a saved seq failure replays as saved."""
    example = space.ANCHORS[0]
    saved = tmp_path / "seq.json"
    saved.write_text(json.dumps({"family": "seq", "example": example}))
    assert options._replay(str(saved)) == (space.check_example(example),)
    assert options._replay(json.dumps([example, example])) == (example, example)
    rule = options._replay(json.dumps({"blocks": ["linear"], "zero": {}}))
    assert rule[0]["blocks"] == ["linear"] and "actions" not in rule[0]
    with pytest.raises(ValueError, match="unknown seq action 'jump'"):
        space.load_replay(json.dumps({"actions": [["jump", {}]]}))


def test_the_reproducer_is_a_program():
    """Why: a user pastes it; the example in it must be the Python value of the failing one."""
    for example in space.ANCHORS + space.draw_examples(3, None):
        tree = ast.parse(space.program(example))
        (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "example"]
        assert ast.literal_eval(value) == example


def _saved(stdout: str) -> str:
    m = re.search(r"Saved to (\S+\.json);", stdout)
    assert m, stdout[-3000:]
    return m.group(1)


@pytest.mark.proof  # two suite runs on a fork (the shrink, then the replay): about 30 s quiet
def test_a_known_bad_shrinks_and_its_saved_failure_replays(run_suite, tmp_path):
    """Why (issue 54): the tied-recovery fork fails seq-a with a shrunk example, a program, and a saved
    file that replays the failure alone through ``--zero3-replay``."""
    from forks import KNOWN_BADS, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    edit(fork, *KNOWN_BADS["tied_recovery"][0])
    run = run_suite(fork, "seq", "--zero3-examples=0")
    assert run.outcomes() == {"seq-a": "fail"}, run.stdout[-4000:]
    assert "Shrunk reproducer" in run.stdout and "KeyError: 'inp.weight'" in run.stdout, run.stdout[-4000:]
    shrunk = json.loads(open(_saved(run.stdout)).read())["example"]
    assert shrunk["features"] == ["tied", "frozen"] and len(shrunk["actions"]) == 2, shrunk
    again = run_suite(fork, "seq", f"--zero3-replay={_saved(run.stdout)}")
    assert again.outcomes() == {"seq-a": "fail"} and "1 replayed" in again.stdout, again.stdout[-4000:]


#: The seq family's known-bads of the newer features and the layout (tests/forks.py), each with the
#: hand-written contracts that drive one half of its pair: the adapters' fetch beside 007-c's PEFT adapters
#: on a bf16 base and 008-h's torch_autocast (mixed communication dtypes); the node-local checkpoint name
#: beside every checkpoint contract, 008-i's two nodes of two included.
NEAREST = {
    "fetch_first_dtype": "007-c,008-h,zoo",
    "ckpt_name_local_rank": "004,008-d,008-i",
}


@pytest.mark.proof  # one suite run of the nearest contracts on a fork each: minutes (scripts/proofs.sh)
@pytest.mark.parametrize("name", sorted(NEAREST))
def test_the_contracts_nearest_a_seq_known_bad_let_it_through(run_suite, tmp_path, name):
    """Why (issue 54, item 6): a known-bad of the seq family is one only a pair reaches: the contracts that
    drive each half of the pair alone let it through with 0.19.8's file, where seq-a's anchors flag it
    (tests/test_fork_gate.py)."""
    from forks import KNOWN_BADS, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path / "fork"))
    edit(fork, *KNOWN_BADS[name][0])
    expect = ROOT / "conformance" / "expectations" / "deepspeed-0.19.8.toml"
    run = run_suite(fork, NEAREST[name], f"--zero3-expect={expect}", "--zero3-examples=0")
    outcomes = run.outcomes()
    assert run.returncode == 0 and "fail" not in outcomes.values(), run.stdout[-4000:]
    assert all(any(cid.startswith(p) for cid in outcomes) for p in NEAREST[name].split(",")), outcomes
