"""Imported once by the forkserver, so every rank forked from it starts with these modules loaded.

A freshly spawned rank spends seconds importing torch and deepspeed (and torch._dynamo, which
torch.optim pulls in lazily on first use).  The forkserver pays that once; a rank forked from it
starts in milliseconds.  What to load comes from the job payload the parent wrote before the
forkserver started (:func:`pytest_zero3.job.payload_path`), a :class:`~pytest_zero3.job.Job`.
"""

import faulthandler
import gc
import importlib
import os
import pickle
import signal
import sys

from pytest_zero3 import dsops, impl, rank
from pytest_zero3.impl import Spec
from pytest_zero3.job import Job, payload_path

#: Always loaded: the harness itself and what any ZeRO-3 rank imports.
BASE = (
    "pytest",
    "_pytest.outcomes",
    "torch",
    "torch.distributed",
    "torch.optim",
    "torch._dynamo",
    "torch.utils.checkpoint",
)
#: Loaded when importable: deepspeed and the parts it imports lazily during initialize().
DEEPSPEED = (
    "deepspeed",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "deepspeed.runtime.zero.partition_parameters",
    "deepspeed.ops.adam",
    # what 0.19.8's initialize() and first step import lazily (every world paid them again); a release
    # without them skips the names
    "deepspeed.module_inject.auto_ep_layer",
    "deepspeed.runtime.superoffload.superoffload_stage3",
    "deepspeed.utils.pin_memory",
    "deepspeed.comm.mori",
    "torch._subclasses.schema_check_mode",
    "torch.profiler._cupti_monitor",
)
#: What a zygote (:mod:`pytest_zero3.zygote`) imports besides :data:`BASE`: the inductor modules that
#: deepspeed.runtime.zero.muon imports, and the Hugging Face stack where it is installed (the zoo's and
#: family 007's models; neither imports deepspeed, and transformers asks whether one is importable only
#: when called, so a fork checkout's forkserver sees its own).  Each rank forkserver of a whole-suite
#: run imported peft and transformers for itself: about 3 s of CPU, once per pytest-xdist worker.
TORCH = ("torch._inductor.compile_fx", "transformers", "peft")


def _load_all() -> None:
    pytest_pid = os.getppid()  # the forkserver is pytest's child (spawner.start_all starts it)
    # Dies with pytest however pytest ends (SIGKILL too), and its ranks die with it (rank._die_with):
    # the "alive" pipe of multiprocessing cannot tell, as every rank holds its write end.
    rank.die_with_parent()
    if os.getppid() != pytest_pid:
        os._exit(1)
    try:
        with open(payload_path(pytest_pid), "rb") as fh:
            job = pickle.load(fh)
    except OSError:  # started by something other than pytest_zero3.spawner: load the basics only
        job = Job(spec=Spec("installed", "installed"), sys_path=(), parent_pid=pytest_pid)
    if job.zygote:
        _load_torch(job)
    else:
        load(job)


def _load_torch(job: Job) -> None:
    """A zygote's load (:mod:`pytest_zero3.zygote`): what every rank forkserver needs but deepspeed."""
    _stack_on_signal(job)
    answer = _ask_cpuinfo()
    _import_all((*BASE, *TORCH))
    _keep_cpuinfo(answer)
    gc.collect()
    gc.freeze()


def _ask_cpuinfo():
    """Start py-cpuinfo's probe, the subprocess its ``get_cpu_info()`` starts and waits for (about 1 s of
    CPU), beside a zygote's or a forkserver's imports; None where py-cpuinfo is missing or the answer
    was inherited (a forkserver forked from a zygote).

    Why: DeepSpeed asks it in every forkserver that loads DeepSpeedCPUAdam (``fixtures/cpu_adam_op.py``)
    and at each op build's CPU check, and the first forkserver of a run asked it on the run's critical
    path, while the zygote's imports had left a core idle (sampled every 0.25 s: 0.8 s with only the
    probe running).  Run here, it overlaps the imports, and every process forked from here inherits the
    answer."""
    import subprocess

    try:
        import cpuinfo.cpuinfo as probe
    except ImportError:
        return None
    if getattr(sys.modules["cpuinfo"].get_cpu_info, "kept_by_zero3", False):
        return None
    # py-cpuinfo's own command and pipes (get_cpu_info_json), started early
    cmd = [sys.executable, probe.__file__, "--json"]
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
    except OSError:
        return None


def _keep_cpuinfo(answer) -> None:
    """Make ``cpuinfo.get_cpu_info()`` return what :func:`_ask_cpuinfo`'s probe printed, as py-cpuinfo
    parses it (a fresh copy per call); a probe that failed leaves py-cpuinfo to ask again itself."""
    if answer is None:
        return
    import copy
    import json

    import cpuinfo
    from cpuinfo import cpuinfo as probe

    out = answer.communicate()[0]
    if answer.returncode != 0:
        return
    info = json.loads(out.decode("UTF-8"), object_hook=probe._utf_to_str)

    def get_cpu_info() -> dict:
        return copy.deepcopy(info)

    get_cpu_info.kept_by_zero3 = True  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info  # DeepSpeed imports the name when it asks
    probe.get_cpu_info = get_cpu_info


def _import_all(names) -> None:
    """Import ``names`` in order; only a missing one of :data:`BASE` is fatal here (the rank that needs
    another one reports its ImportError with its own traceback)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            if name in BASE:
                raise


def _stack_on_signal(job: Job) -> None:
    if job.forkserver_stack:  # lets the parent see where a slow or stuck preload is
        faulthandler.register(signal.SIGUSR1, file=open(job.forkserver_stack, "w"), all_threads=True)


def load(job: Job) -> None:
    """Load what ``job`` names, in this forkserver (started by pytest, or forked from a zygote)."""
    _stack_on_signal(job)
    # The parent's path, in its order: a fork checkout first, then test-local modules.
    sys.path[:0] = [entry for entry in job.sys_path if entry not in sys.path]
    # The user's preloads first: one that blocks (a stale build lock) shows in the stack at once, and
    # each imports what it needs of torch itself.
    impl.loading = job.spec
    answer = _ask_cpuinfo()
    _import_all((*job.preload, *BASE, *DEEPSPEED))
    _keep_cpuinfo(answer)
    dsops.probe()
    dsops.skip_cpu_shm_comm_op()
    if job.spec.kind in ("reference", "class"):
        # Imported, not installed: ranks inherit the module and install it themselves.  A ``class``
        # spec's own module is loaded by each rank, never here: it may patch deepspeed when imported
        # (the bad coordinators here call reference_impl.install() at import), and this forkserver
        # outlives the session that started it when it is held (spawner.held).
        try:
            importlib.import_module("pytest_zero3.reference_impl")
        except Exception:  # noqa: BLE001 - the rank that installs it reports the error with its traceback
            pass
    # DeepSpeed calls gc.collect() while building the optimizer; with torch's import graph in the heap
    # that takes over a second per rank.  Frozen objects are skipped by the collector.
    gc.collect()
    gc.freeze()
    huge_pages()


#: ``madvise`` advice: back a range with transparent huge pages now (Linux 6.1+; EINVAL before, and
#: where huge pages are off).
MADV_COLLAPSE = 25
HUGE_PAGE = 1 << 21


def huge_pages() -> None:
    """Back this forkserver's private memory with transparent huge pages (``MADV_COLLAPSE``), once it
    has loaded: every rank is a fork of it, and a fork copies one page-table entry per page of it, which
    the rank's exit then tears down.  About 360 MB of torch, transformers and deepspeed in 4 kB pages
    cost 11 ms of system time in the forkserver per fork and 15 ms in the rank's exit; in 2 MB pages
    2.7 ms and 5.7 ms (measured in one process holding the same imports; 320 ranks in the default run).
    A rank that writes to a huge page gets the 4 kB page it wrote copied, as before: what ranks compute
    and share does not change.  Collapsing costs this process about 0.4 s of CPU once; a kernel or a
    setting without it leaves the memory as it was."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as fh:
            maps = fh.read().splitlines()
    except (OSError, AttributeError):
        return
    for line in maps:
        fields = line.split()
        name = fields[5] if len(fields) > 5 else ""
        if "w" not in fields[1] or "p" not in fields[1] or (name and name != "[heap]"):
            continue  # private, writable, anonymous memory (and the malloc heap) only
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start, end = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), end & ~(HUGE_PAGE - 1)
        if end > start:
            libc.madvise(start, end - start, MADV_COLLAPSE)  # refused: the range stays in small pages


_load_all()
