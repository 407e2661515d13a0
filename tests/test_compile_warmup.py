"""The compile profile's forkserver warm-up (``fixtures/compile_warmup.py``), run as a forkserver runs it:
imported in a fresh process, which then plays a rank.

Why: the warm-up trains a compiled stage-3 engine in a one-rank world inside the process every rank
of a run forks from.  What it must leave behind is dynamo's compiled frames and nothing else: no
world, no DeepSpeed groups or comm backend, no rank variables, no param ids used up, torch's own
``F.linear``, nothing printed;
and a rank must still compile its own variants of a hook the warm-up compiled more often than dynamo's
recompile limit allows, as a fresh process would (else the rank runs those hooks eagerly, and the
compile profile stops judging what it says it judges); and a rank training the warm-up's own model
must find the model's frames compiled; and dynamo must format no log line while its logs are off.
Cost: one process, three small compiled engines, about 10 s on 2 cores.
"""

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys
import torch, deepspeed
before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
import pytest_zero3.fixtures.compile_warmup
sys.stdout.write("WARMED\n"); sys.stdout.flush(); sys.stderr.write("WARMED\n"); sys.stderr.flush()
import deepspeed.comm.comm as ds_comm
import torch._dynamo.utils as dynamo_utils
from deepspeed.runtime.zero.partition_parameters import Init
from deepspeed.utils import groups
from torch._dynamo import convert_frame
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.nn.modules import module as nn_module

def entries(name):
    codes = [ref() for ref in convert_frame.input_codes.seen]
    return sum(len(_debug_get_cache_entry_list(c)) for c in codes if c is not None and c.co_name == name)

left = dict(
    frames=dynamo_utils.counters["frames"]["total"],
    world=torch.distributed.is_initialized(),
    comm_backend=repr(ds_comm.cdb),
    world_group=repr(groups._WORLD_GROUP),
    param_id=Init.param_id,
    env_unchanged=before == {k: os.environ.get(k) for k in before},
    module_hooks=sum(len(v) for k, v in vars(nn_module).items() if k.startswith("_global_") and k.endswith("hooks")),
    hook_entries=entries("_post_forward_module_hook"),
    linear=torch.nn.functional.linear is torch._C._nn.linear,
    deterministic=torch.are_deterministic_algorithms_enabled(),
)
# dynamo's logs: nothing formatted for a log that is off, the same lines as torch's where it is on
import io, logging
import torch._dynamo.symbolic_convert as sc
work = []
stack_above, funcname = sc.get_stack_above_dynamo, sc.get_funcname
sc.get_stack_above_dynamo = lambda: work.append("stack") or stack_above()
sc.get_funcname = lambda *a: work.append("funcname") or funcname(*a)
def broken_quiet(x):
    y = torch.sin(x)
    torch._dynamo.graph_break()
    return y * 2
def broken_logged(x):
    y = torch.sin(x)
    torch._dynamo.graph_break()
    return y * 2
torch.compile(broken_quiet, backend="eager")(torch.ones(3))
left["formatted_for_no_log"] = list(work)
buf = io.StringIO()
handler = logging.StreamHandler(buf)
logging.getLogger("torch._dynamo").addHandler(handler)
torch._logging.set_logs(graph_breaks=True, trace_call=True)
torch.compile(broken_logged, backend="eager")(torch.ones(3))
torch._logging.set_logs()
logging.getLogger("torch._dynamo").removeHandler(handler)
sc.get_stack_above_dynamo, sc.get_funcname = stack_above, funcname
logged = buf.getvalue()
left["graph_break_logged"] = "Graph break in user code" in logged and "broken_logged" in logged
left["call_header_logged"] = "TRACE FX call sin from <string>:" in logged and " in broken_logged" in logged
left["formatted_for_log"] = sorted(set(work))
# now a rank: its own world and thread count, the warm-up's model (nothing new to trace), then a model of
# other module types, compiled
from pytest_zero3 import rank
from pytest_zero3.fixtures import engine as eng
from pytest_zero3.fixtures.config import MICRO_BATCH, zero3_config
from pytest_zero3.fixtures.models import MLP, WIDTH
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29583")
rank.one_thread_unless_chosen()
from pytest_zero3.fixtures.profile_run import poison_uninitialized_memory
poison_uninitialized_memory()  # as every rank does under --zero3-poison (on by default)
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = MLP(4)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=zero3_config(1))
engine.compile(backend="eager")
def per_code():
    codes = [ref() for ref in convert_frame.input_codes.seen]
    return {f"{c.co_name}:{c.co_firstlineno}": len(_debug_get_cache_entry_list(c)) for c in codes if c is not None}
had = per_code()
for _ in range(2):
    eng.train_step(engine, torch.randn(MICRO_BATCH, WIDTH))
left["same_model_new_entries"] = {k: n - had.get(k, 0) for k, n in per_code().items() if n != had.get(k, 0)}
engine.destroy()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.compile(backend="eager")
engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
engine.step()
left["rank_hook_entries"] = entries("_post_forward_module_hook")
sys.stdout.write("PROBE " + json.dumps(left) + "\n")
"""


@pytest.fixture(scope="module")
def probed():
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["DS_ACCELERATOR"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    printed = proc.stdout.split("WARMED")[0] + proc.stderr.split("WARMED")[0]  # up to the warm-up's end
    return json.loads(line[len("PROBE ") :]), printed


def test_the_warm_up_compiles_deepspeeds_hooks_and_leaves_no_world(probed):
    left, _ = probed
    assert left["frames"] > 50, left  # the engine's hooks and the MLP were traced here
    assert left["hook_entries"] >= 1, left
    assert not left["world"], left
    assert left["comm_backend"] == "None" and left["world_group"] == "None", left
    assert left["param_id"] == 0, left  # a rank's params are numbered from 0, as in a fresh process
    assert left["env_unchanged"], left
    assert left["module_hooks"] == 0, left
    # stage 3's memory-efficient linear stays installed "until manually reset": a rank whose config turns
    # it off ran it anyway (every compiled-autograd backward of 008-m a cache miss)
    assert left["linear"], left
    assert not left["deterministic"], left  # the warm-up's poisoned mode is put back: a rank sets its own


def test_the_warm_up_prints_nothing(probed):
    """Its world's deprecation warnings, dynamo's recompile-limit warnings and DeepSpeed's logs would
    reach the terminal of every run with a compile profile, from the forkserver."""
    _, printed = probed
    for noise in ("Warning", "recompile_limit", "[rank0]", "DeepSpeed info"):
        assert noise not in printed, printed[-3000:]


def test_a_rank_keeps_its_own_recompile_budget(probed):
    """The warm-up's MLP leaves 9 entries of ``_post_forward_module_hook``, past dynamo's limit of 8 (the
    warm-up runs without it); a rank's model of other module types still compiles its own variants (a
    fresh process would)."""
    left, _ = probed
    assert left["rank_hook_entries"] > left["hook_entries"], left


def test_a_rank_reuses_what_the_warm_up_compiled(probed):
    """A rank training the warm-up's own model traces again only DeepSpeed's module hooks, whose guards
    match the new engine's own objects (its offload manager, its modules' ``ds_id``); the model's frames
    and the rest of stage 3's hooks pass every guard.  Dynamo's global-state guard compares torch's
    intra-op thread count, which a rank sets to one (``rank.one_thread_unless_chosen``), and its
    deterministic mode, which a poisoned rank turns on: a warm-up compiled at the machine's count, or
    unpoisoned, left every entry failing it, and each rank traced the model again."""
    left, _ = probed
    engine_bound = {"_post_forward_module_hook", "post_sub_module_forward_function", "_pre_backward_module_hook"}
    new = {name.split(":")[0] for name in left["same_model_new_entries"]}
    assert new <= engine_bound, left["same_model_new_entries"]


def test_dynamo_formats_no_log_line_nobody_reads(probed):
    """The ranks skip the work dynamo does for its graph-break and trace-call logs while those logs are
    off (the stack above dynamo, each traced file tokenized for its function names: 6 % of a compiled
    world's CPU), and write the same lines as torch's when they are on."""
    left, _ = probed
    assert left["formatted_for_no_log"] == [], left["formatted_for_no_log"]
    assert left["graph_break_logged"], left
    assert left["call_header_logged"], left
    assert left["formatted_for_log"] == ["funcname", "stack"], left["formatted_for_log"]
