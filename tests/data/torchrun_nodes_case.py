"""Run by tests/test_nodes.py as two ``torchrun --nnodes 2 --node_rank i --nproc_per_node 2`` launches
(c10d rendezvous, one host): a scenario that node 1's pytest never reaches is a world error naming its
ranks, the contracts run on the 4-rank world both launches form, the hpz profile keeps one node's
ranks as its secondary partition, and a bug on rank 3 (the other node's second rank) fails both
launches, named by rank."""

import os

import pytest
from pytest_zero3.fixtures import profiles

from pytest_zero3 import scenario


@pytest.mark.zero3_contract("996-0", "a node whose pytest never reaches the world")
@pytest.mark.zero3_timeout(5)
def test_a_node_that_never_joins_is_a_world_error(zero3_world):
    """First in the file: node 1's ranks (2 and 3) have reached no world yet, and skip this one; they go
    on only once both of node 0's ranks are done with it (else they would reach the next world, and post
    their presence, while a rank of node 0 still reads who never joined)."""
    key = "torchrun_nodes_case/996-0/done"
    if int(os.environ["RANK"]) >= 2:
        import datetime

        import torch.distributed as dist

        store, _, _ = next(dist.rendezvous("env://"))  # the launcher's store, as the plugin reaches it
        store.wait([f"{key}/0", f"{key}/1"], datetime.timedelta(seconds=120))
        return
    try:
        zero3_world.run(where)
    finally:
        from pytest_zero3 import launcher

        launcher._store.set(f"{key}/{os.environ['RANK']}", "1")


def where():
    return scenario.rank(), scenario.world_size(), int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["GROUP_RANK"])


@pytest.mark.zero3_contract("996-a", "the world spans both nodes")
def test_the_world_spans_both_nodes(zero3_world):
    assert zero3_world.run(where) == [(0, 4, 2, 0), (1, 4, 2, 0), (2, 4, 2, 1), (3, 4, 2, 1)]


def hpz_step():
    """One training step under the profile's config; the secondary partition's ranks and size."""
    import torch
    import torch.distributed as dist
    from deepspeed.utils import groups
    from pytest_zero3.fixtures import engine as eng
    from pytest_zero3.fixtures.config import zero3_config
    from pytest_zero3.fixtures.models import MLP, WIDTH

    engine = eng.build(lambda: MLP(2, WIDTH), zero3_config(scenario.world_size()))
    engine.backward(engine(torch.ones(2, WIDTH)).sum())  # backward gathers from the secondary shards
    engine.step()
    return engine.zero_hpz_partition_size(), dist.get_process_group_ranks(groups._get_zero_param_intra_parallel_group())


@pytest.mark.zero3_contract("996-b", "hpz's secondary partition is one node's ranks")
def test_hpz_secondary_partition_is_one_node(zero3_world):
    out = zero3_world.run(profiles.CALL, "hpz", {}, hpz_step, (), {})
    assert out == [(2, [0, 1]), (2, [0, 1]), (2, [2, 3]), (2, [2, 3])]


def bug_on_rank_three():
    if scenario.rank() == 3:
        raise ValueError("a bug on the other node")
    return "fine"


@pytest.mark.zero3_contract("996-c", "a bug on the other node's rank")
def test_bug_on_the_other_node(zero3_world):
    zero3_world.run(bug_on_rank_three)
