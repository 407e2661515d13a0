"""An async all-gather's output reads poison until its own handle is waited on (gloo; ``--zero3-poison``).

Gloo runs async collectives on independent worker threads: a wait on one handle says nothing of another,
and a read that timing decides must fail every run (fixtures/profile_run.py, poison_unwaited_gathers)."""


def gathers_waited_in_turn():
    """Two async in-place gathers, then a sync one, read before and after each wait; with the guard on."""
    import torch
    import torch.distributed as dist
    from pytest_zero3.fixtures.profile_run import poison_unwaited_gathers

    from pytest_zero3 import scenario

    poison_unwaited_gathers()
    poison_unwaited_gathers()  # once is enough: a second call wraps nothing again
    r, n = scenario.rank(), scenario.world_size()

    def in_place(dtype, base):
        out = torch.empty(2 * n, dtype=dtype)
        out[2 * r : 2 * r + 2] = torch.tensor([base + r, base + r], dtype=dtype)
        return out, out[2 * r : 2 * r + 2]  # the input is this rank's own chunk of the output

    first, first_in = in_place(torch.float32, 10)
    second, second_in = in_place(torch.int64, 20)
    h1 = dist.all_gather_into_tensor(first, first_in, async_op=True)
    h2 = dist.all_gather_into_tensor(second, second_in, async_op=True)
    own_chunk = first_in.tolist()  # the rank's own chunk holds what it sends; the peers' read NaN
    h2.wait()
    before = first.tolist(), second.tolist()
    h1.wait()
    h1.wait()  # a second wait writes nothing again
    sync = torch.empty(n)
    dist.all_gather_into_tensor(sync, torch.tensor([float(r)]))
    return own_chunk, before, first.tolist(), sync.tolist()


def test_a_gather_reads_poison_until_its_own_handle_is_waited(zero3_world):
    """Why: 0.19.3's coalesced gather waited on its last handle only (DeepSpeed PR 8539); its other params
    read whatever memory held in the runs gloo's timing was against it (a norm weight at 2.2e10 in one
    zoo run of three).  Waiting on the second gather must leave the first one's output poisoned (the
    rank's own chunk as it was: gathered in place) and the integer one whole; the first's wait lands it;
    a synchronous gather is untouched."""
    for r, (own_chunk, (first_before, second_before), first_after, sync) in enumerate(
        zero3_world.run(gathers_waited_in_turn)
    ):
        assert own_chunk == [10.0 + r] * 2
        others = first_before[: 2 * r] + first_before[2 * r + 2 :]
        assert first_before[2 * r : 2 * r + 2] == own_chunk and all(x != x for x in others), first_before
        assert second_before == [20, 20, 21, 21]
        assert first_after == [10.0, 10.0, 11.0, 11.0]
        assert sync == [0.0, 1.0]


def poisoned_int_output_before_wait():
    import torch
    import torch.distributed as dist
    from pytest_zero3.fixtures.profile_run import poison_unwaited_gathers

    poison_unwaited_gathers()
    out = torch.zeros(2, dtype=torch.int32)
    handle = dist.all_gather_into_tensor(out, torch.tensor([7], dtype=torch.int32), async_op=True)
    before = out.tolist()
    while not handle.is_completed():  # a handle that reports itself complete lands its output too
        pass
    return before, out.tolist()


def test_an_integer_output_reads_its_largest_value_and_completion_lands_it(zero3_world):
    for before, after in zero3_world.run(poisoned_int_output_before_wait):
        assert before == [2**31 - 1] * 2
        assert after == [7, 7]


#: DeepSpeed PR 8539 undone on 0.19.8: ``_allgather_params_coalesced`` waits on its last handle only, as
#: 0.19.3 and every release before it did.
UNWAITED_COALESCED = (
    "runtime/zero/partition_parameters.py",
    "        for handle in launch_handles:\n            handle.wait()",
    "        launch_handles[-1].wait()",
)


def test_the_coalesced_gather_waiting_on_its_last_handle_fails_by_default(run_suite, tmp_path_factory):
    """Why: with PR 8539 undone, 0.19.8 passed every contract in a run with the guard off, and failed the
    same 18 tests in each of two runs with it on (the zoo, 004-b, 004-f, base-e, 005-b, c, e, f, 007-b,
    007-e, 008-f, 008-i, rule-h, the seq family): the post-step re-gather of persistent params and every
    multi-param ``GatheredParameters`` read NaN.  004-f's checkpoints and 16-bit saves show it first."""
    from forks import ForkCache

    fork = ForkCache(tmp_path_factory, {"unwaited-coalesced": UNWAITED_COALESCED})("unwaited-coalesced")
    run = run_suite(fork, "004-f")  # no option: poisoned
    assert run.outcomes().get("004-f") == "fail", run.stdout[-4000:]
    assert "differs by up to nan" in run.stdout, run.stdout[-4000:]


def guard_under_another_backend():
    import torch.distributed as dist
    from pytest_zero3.fixtures import profile_run

    before = dist.all_gather_into_tensor
    dist.get_backend = lambda *a, **k: "nccl"  # this rank's process only
    profile_run.poison_unwaited_gathers()
    return dist.all_gather_into_tensor is before


def test_other_backends_are_left_alone(zero3_world):
    """NCCL orders a rank's gathers on one stream, so waiting on the last covers the ones before it:
    the guard wraps nothing where the process group is not gloo."""
    assert zero3_world.run(guard_under_another_backend) == [True, True]
