"""The world harness: results, failures, hangs, deaths, skips, isolation (issue: foundation §3)."""

import os
import signal

import pytest

from pytest_zero3 import scenario
from pytest_zero3.scenario import Unsupported
from pytest_zero3.world import WorldFailure


def all_reduce_rank_sum():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(scenario.rank() + 1)])
    dist.all_reduce(t)
    return scenario.rank(), scenario.world_size(), t.item(), os.getpid()


def test_run_returns_per_rank_values_in_rank_order(zero3_world):
    out = zero3_world.run(all_reduce_rank_sum)
    assert [o[:3] for o in out] == [(0, 2, 3.0), (1, 2, 3.0)]


def test_every_run_gets_fresh_rank_processes(zero3_world):
    first = {o[3] for o in zero3_world.run(all_reduce_rank_sum)}
    second = {o[3] for o in zero3_world.run(all_reduce_rank_sum)}
    assert first.isdisjoint(second)


@pytest.mark.zero3_world_size(3)
def test_world_size_marker(zero3_world):
    assert [o[1] for o in zero3_world.run(all_reduce_rank_sum)] == [3, 3, 3]


def deepspeed_sees_world():
    """DeepSpeed's CPU accelerator derives its device count from LOCAL_SIZE: multi-rank must not be skipped."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_count(), os.environ.get("DS_ACCELERATOR")


def test_deepspeed_cpu_accelerator_counts_every_rank(zero3_world):
    assert zero3_world.run(deepspeed_sees_world) == [(2, "cpu"), (2, "cpu")]


def ask_cpuinfo():
    """py-cpuinfo's answer in a rank, and the subprocesses asking it started (none: its forkserver or zygote asked it)."""
    import subprocess

    import cpuinfo

    started = []
    real = subprocess.Popen

    class Counting(real):  # py-cpuinfo imports Popen from subprocess when it asks
        def __init__(self, args, *rest, **kwargs):
            started.append(args)
            super().__init__(args, *rest, **kwargs)

    subprocess.Popen = Counting
    try:
        info = cpuinfo.get_cpu_info()
    finally:
        subprocess.Popen = real
    return started, {k: info.get(k) for k in ("arch", "vendor_id_raw", "brand_raw", "count")}


def test_ranks_reuse_the_forkservers_cpuinfo_answer(zero3_world):
    """Why: py-cpuinfo starts a Python subprocess per question (about 1 s of CPU); DeepSpeed asks it for
    DeepSpeedCPUAdam and its op builds.  The zygote, or a forkserver started without one (this test's),
    asks it once beside its imports."""
    cpuinfo = pytest.importorskip("cpuinfo")
    want = {k: cpuinfo.get_cpu_info().get(k) for k in ("arch", "vendor_id_raw", "brand_raw", "count")}
    assert zero3_world.run(ask_cpuinfo) == [([], want), ([], want)]


def raise_on_rank_one():
    if scenario.rank() == 1:
        raise ValueError("rank one broke")
    import torch.distributed as dist

    dist.barrier()  # rank 0 would wait here forever without the harness


def test_rank_exception_fails_with_each_rank_labelled(zero3_world):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(raise_on_rank_one)
    text = str(info.value)
    assert "rank 1: raised: ValueError: rank one broke" in text
    assert "in raise_on_rank_one\n" in text and "raise ValueError" in text
    assert "rank 0: " in text and "rank 0: passed" not in text  # rank 0 failed in barrier or was stopped


def pass_on_rank_zero_raise_on_one():
    if scenario.rank() == 1:
        raise KeyError("only one")
    return "fine"


def test_passing_rank_is_reported_as_passed(zero3_world):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(pass_on_rank_zero_raise_on_one)
    assert "rank 0: passed" in str(info.value)
    assert "rank 1: raised: KeyError: 'only one'" in str(info.value)


def wait_forever_in_named_function():
    import threading

    threading.Event().wait()  # blocks until killed


def hang_on_rank_zero():
    if scenario.rank() == 0:
        wait_forever_in_named_function()
    import torch.distributed as dist

    dist.barrier()


@pytest.mark.zero3_timeout(4)
def test_hang_reports_every_live_rank_stack_then_next_scenario_runs(zero3_world):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(hang_on_rank_zero)
    text = str(info.value)
    assert "rank 0: hung: still running after the 4 s timeout" in text
    assert "rank 1: hung" in text
    assert "in wait_forever_in_named_function" in text  # rank 0's Python stack
    assert "in hang_on_rank_zero" in text
    assert "barrier" in text  # rank 1's stack shows where it waits
    assert zero3_world.run(all_reduce_rank_sum)[0][2] == 3.0  # the harness recovered


def kill_self(sig):
    if scenario.rank() == 1:
        os.kill(os.getpid(), sig)
    import torch.distributed as dist

    dist.barrier()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_rank_death_is_reported(zero3_world, sig):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(kill_self, sig)
    text = str(info.value)
    assert f"rank 1: died: killed by {sig.name}" in text
    if sig == signal.SIGSEGV:
        assert "Fatal Python error: Segmentation fault" in text and "in kill_self" in text


def exit_abruptly():
    if scenario.rank() == 0:
        os._exit(3)
    return "ok"


def test_rank_exiting_without_result(zero3_world):
    with pytest.raises(WorldFailure, match="rank 0: died: exited with code 3 before reporting a result"):
        zero3_world.run(exit_abruptly)


def skip_everywhere():
    pytest.skip("needs a feature this world lacks")


def test_skip_on_all_ranks_is_a_skip(zero3_world):
    with pytest.raises(pytest.skip.Exception, match="needs a feature this world lacks"):
        zero3_world.run(skip_everywhere)


def declare_unsupported():
    scenario.unsupported("config rejects the keys")


def test_unsupported_is_declared(zero3_world):
    with pytest.raises(Unsupported, match="config rejects the keys"):
        zero3_world.run(declare_unsupported)


def disagree():
    scenario.agree(scenario.rank() == 0, f"rank {scenario.rank()} is not rank 0")
    return "unreachable on failure"


def test_agree_fails_every_rank_with_the_failing_ranks_message(zero3_world):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(disagree)
    text = str(info.value)
    assert "ranks 0, 1: raised: AssertionError: [rank 1] rank 1 is not rank 0" in text
    assert "hung" not in text


def print_and_fail():
    print(f"diagnostic line from rank {scenario.rank()}", flush=True)
    raise RuntimeError("after printing")


def test_rank_output_is_in_the_failure_text(zero3_world):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(print_and_fail)
    assert "diagnostic line from rank 1" in str(info.value)


def unpicklable_result():
    import threading

    return threading.Lock()


def test_unpicklable_result_is_a_clear_failure(zero3_world):
    with pytest.raises(WorldFailure, match="(?s)TypeError: cannot pickle"):
        zero3_world.run(unpicklable_result)


def block_with_stack_signal_ignored():
    import threading

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # this rank will never write a stack
    threading.Event().wait()


@pytest.mark.zero3_world_size(4)
@pytest.mark.zero3_timeout(2)
def test_stacks_of_live_ranks_are_awaited_together(zero3_world):
    """Four hung ranks that never write a stack cost one stack wait (3 s), not four in a row (12 s)."""
    import time

    from pytest_zero3 import world

    start = time.monotonic()
    outcomes = zero3_world.outcomes(block_with_stack_signal_ignored)
    took = time.monotonic() - start
    assert [o.status for o in outcomes] == ["hung"] * 4
    assert took < 2 + world.STACK_SECONDS + 6, f"stopping 4 hung ranks took {took:.1f} s"  # one by one: 14+ s


def finish_when_asked_for_a_stack():
    import threading

    if scenario.rank() == 0:
        raise ValueError("rank zero broke")
    asked = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: asked.set())  # the harness's stack request ends the wait
    asked.wait()
    return "finished while being stopped"


def test_rank_that_finishes_while_being_stopped_keeps_its_result(zero3_world, monkeypatch):
    from pytest_zero3 import world

    monkeypatch.setattr(world, "GRACE_SECONDS", 0.5)
    outcomes = zero3_world.outcomes(finish_when_asked_for_a_stack)
    assert outcomes[0].status == "raised"
    assert (outcomes[1].status, outcomes[1].value) == ("passed", "finished while being stopped"), outcomes[1]


def note_each_run(marker_dir):
    """Leaves one file per rank and run, so a test can count how often the scenario ran."""
    with open(os.path.join(marker_dir, f"rank{scenario.rank()}-pid{os.getpid()}"), "w"):
        pass
    return scenario.rank()


def _store_unusable_in(monkeypatch, tries):
    """Make the world's store a directory in the first ``tries`` tries: no rank can join the process
    group (the store fails to open), as when gloo cannot connect the ranks of a loaded machine."""
    from pytest_zero3 import world

    made = []
    real = world.World._new_run_dir

    def new_run_dir(self):
        run_dir = real(self)
        if len(made) < tries:
            os.mkdir(os.path.join(run_dir, "store"))
        made.append(run_dir)
        return run_dir

    monkeypatch.setattr(world.World, "_new_run_dir", new_run_dir)
    return made


def test_world_that_did_not_form_is_formed_again_and_the_scenario_runs_once(zero3_world, monkeypatch, tmp_path):
    tries = _store_unusable_in(monkeypatch, 1)
    assert zero3_world.run(note_each_run, str(tmp_path)) == [0, 1]
    assert len(tries) == 2
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["rank0", "rank1"]  # ran once per rank


def test_world_that_never_forms_is_not_a_scenario_failure(zero3_world, monkeypatch, tmp_path):
    from pytest_zero3 import world

    tries = _store_unusable_in(monkeypatch, world.FORM_ATTEMPTS)
    with pytest.raises(world.WorldNotFormed) as info:
        zero3_world.run(note_each_run, str(tmp_path))
    text = str(info.value)
    assert text.startswith("the world did not form: 2 ranks could not form a process group in 3 tries"), text
    assert "rank 0: unformed: could not join the world: DistStoreError: Is a directory" in text, text
    assert "rank 1: unformed: could not join the world: DistStoreError: Is a directory" in text, text
    assert len(tries) == world.FORM_ATTEMPTS and not list(tmp_path.iterdir())  # the scenario never ran
    assert isinstance(info.value, pytest.fail.Exception) and not info.value.pytrace  # pytest shows the text as is


def die_while_the_peer_waits(how):
    import torch.distributed as dist

    if scenario.rank() == 0:
        if how == "exit":
            os._exit(3)
        os.abort()
    dist.barrier()  # rank 1 raises here when rank 0's connection goes away


@pytest.mark.parametrize("how, cause", [("exit", "exited with code 3"), ("abort", "killed by SIGABRT")])
def test_reason_names_the_rank_that_died_not_the_peer_it_left(zero3_world, how, cause):
    from pytest_zero3.outcome import first_failure

    with pytest.raises(WorldFailure) as info:
        zero3_world.run(die_while_the_peer_waits, how)
    outcomes, text = info.value.outcomes, str(info.value)
    assert outcomes[0].status == "died" and outcomes[1].status in ("raised", "stopped"), text
    assert first_failure(outcomes).startswith(f"rank 0 died: {cause}"), first_failure(outcomes)
    details = text.split("\n\n", 2)[2]  # after the title and the per-rank lines: the details, cause first
    assert details.startswith(f"rank 0: died: {cause}"), text


def test_cause_order_died_raised_hung_then_peer_gone():
    from pytest_zero3.outcome import RankOutcome, first_failure

    peer_gone = RankOutcome(
        0, "raised", message="RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection reset by peer"
    )
    hung = RankOutcome(1, "hung", message="still running after the 5 s timeout")
    raised = RankOutcome(2, "raised", message="ValueError: broke")
    died = RankOutcome(3, "died", message="killed by SIGSEGV")
    assert first_failure([peer_gone, hung]) == "rank 1 hung: still running after the 5 s timeout"
    assert first_failure([peer_gone, hung, raised]) == "rank 2 raised: ValueError: broke"
    assert first_failure([peer_gone, hung, raised, died]) == "rank 3 died: killed by SIGSEGV"
    assert first_failure([peer_gone]).startswith("rank 0 raised: RuntimeError")


def leave_while_the_peer_collects(ending):
    """Rank 0 ends the scenario its own way before a collective rank 1 is already in: rank 1 sees
    rank 0's exit as a closed connection (the race of a rank that decides "unsupported" while a peer
    still forms a group with it, made to happen every time)."""
    import torch
    import torch.distributed as dist

    if scenario.rank() == 0:
        {
            "unsupported": lambda: scenario.unsupported("the config rejects the keys"),
            "skip": lambda: pytest.skip("not on this world"),
            "xfail": lambda: pytest.xfail("known to fail here"),
            "pass": lambda: None,
        }[ending]()
        return "left"
    dist.all_reduce(torch.ones(1))  # rank 0 never comes: its exit closes the connection under this call
    return "reduced"


@pytest.mark.parametrize(
    "ending, verdict, words",
    [
        ("unsupported", Unsupported, "the config rejects the keys"),
        ("skip", pytest.skip.Exception, "not on this world"),
        ("xfail", pytest.xfail.Exception, "known to fail here"),
    ],
)
def test_a_peer_that_left_on_its_own_ending_is_no_failure(zero3_world, ending, verdict, words):
    """A world's verdict explains its ranks: rank 1's communication error after rank 0 left
    unsupported (skipped, expected to fail) is rank 0's ending, not a failure, and the reason says so."""
    with pytest.raises(verdict) as info:
        zero3_world.run(leave_while_the_peer_collects, ending)
    reason = str(info.value.msg)
    assert reason.startswith(words), reason
    assert "rank 1 failed only on a communication error after rank 0 left with this outcome, and takes it" in reason


def test_a_communication_error_no_peer_explains_fails_naming_who_left_first(zero3_world):
    """Rank 0 passed and left while rank 1 waited in a collective: the ranks disagree on what the
    scenario does, a failure, and its text names the rank that left first."""
    from pytest_zero3.outcome import first_failure

    with pytest.raises(WorldFailure) as info:
        zero3_world.run(leave_while_the_peer_collects, "pass")
    outcomes, text = info.value.outcomes, str(info.value)
    assert [o.status for o in outcomes] == ["passed", "raised"], text
    assert "rank 1: raised: " in text and "(after rank 0 left first, passed," in text, text
    assert first_failure(outcomes).startswith("rank 1 raised: "), first_failure(outcomes)
    assert "after rank 0 left first, passed" in first_failure(outcomes)


def test_which_communication_errors_a_peer_explains():
    """Only an error that came after the peer left, in a world where no rank failed for itself."""
    from pytest_zero3.outcome import RankOutcome, explain

    def gone(rank, at):
        return RankOutcome(rank, "raised", message="RuntimeError: Connection closed by peer", ended_at=at)

    unsupported = RankOutcome(0, "unsupported", message="no such feature", ended_at=1.0)
    assert [o.status for o in explain([unsupported, gone(1, 2.0)])] == ["unsupported", "unsupported"]
    assert explain([unsupported, gone(1, 2.0)])[1].follows == 0
    assert explain([unsupported, gone(1, 0.5)])[1].status == "raised"  # failed before the peer left
    raised = RankOutcome(2, "raised", message="ValueError: broke", ended_at=0.1)
    assert [o.status for o in explain([unsupported, gone(1, 2.0), raised])] == ["unsupported", "raised", "raised"]
    died = RankOutcome(2, "died", message="killed by SIGSEGV", ended_at=0.1)
    assert explain([unsupported, gone(1, 2.0), died])[1].status == "raised"
    stopped = RankOutcome(2, "stopped", ended_at=9.0)  # the harness stopped it: no ending of its own
    assert [o.status for o in explain([unsupported, gone(1, 2.0), stopped])] == ["unsupported"] * 2 + ["stopped"]
    passed = RankOutcome(2, "passed", ended_at=0.1)  # left before the error, but passing explains nothing
    assert explain([passed, gone(1, 2.0)])[1].status == "raised"
    assert explain([passed, unsupported, gone(1, 2.0)])[2].follows == 0


def test_which_tries_count_as_a_world_that_did_not_form():
    """Only a failure to join is tried again; a set-up error before joining would repeat, so it fails."""
    from pytest_zero3.outcome import RankOutcome
    from pytest_zero3.world import not_formed

    def outs(*statuses):
        return [RankOutcome(r, s) for r, s in enumerate(statuses)]

    assert not_formed(outs("unformed", "stopped"), joined={0, 1})  # gloo could not connect; the peer was stopped
    assert not_formed(outs("died", "stopped"), joined={0, 1})  # died while joining
    assert not_formed(outs("hung", "hung"), joined={0, 1})  # the store never saw every rank
    assert not not_formed(outs("died", "stopped"), joined={1})  # died before joining: in its own set-up
    assert not not_formed(outs("raised", "unformed"), joined={1})  # a set-up error (importing the impl) fails
    assert not not_formed(outs("stopped", "stopped"), joined={0, 1})


@pytest.mark.parametrize("name", ["TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK"])
def test_variables_torch_sets_in_pytests_process_keep_the_forkserver(monkeypatch, name):
    """Why: computing a plain-torch reference in pytest's process makes inductor set its cache dir (and
    importing deepspeed sets NVML's check); a forkserver keyed by them was restarted mid-suite, about
    12 s each time.  The forkserver and its ranks compute the same values themselves."""
    import sys

    from pytest_zero3 import impl, spawner, zygote
    from pytest_zero3.job import Job

    monkeypatch.delenv(name, raising=False)
    job = Job(spec=impl.parse("reference"), sys_path=tuple(sys.path), parent_pid=os.getpid())
    before, torch_before = spawner._fits(job), zygote.torch_env()
    monkeypatch.setenv(name, "/tmp/set-by-torch")
    assert spawner._fits(job) == before and zygote.torch_env() == torch_before
    monkeypatch.setenv("ZERO3_SOMETHING_THE_USER_SET", "1")  # any other variable still counts
    assert spawner._fits(job) != before and zygote.torch_env() != torch_before
