"""pytest entry point of pytest-zero3 (``pytest11`` entry point ``zero3``).

The plugin is a guest: a run that passes no ``--zero3-*`` option and collects no test that uses
``zero3_world`` or carries ``zero3_contract`` sees no change at all (environment, signal handlers,
atexit hooks, output, imports).  Its state lives in one :class:`Zero3Session` registered as a plugin
(as pytest-xdist registers its session object); it activates when asked or on first use, sets up the
process when the first world starts, and undoes that at the end of the session.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import tempfile
from typing import Callable

import pytest

from pytest_zero3 import accel, baseline, expectations, impl, judging, launcher, markers, options, registry, spawner
from pytest_zero3.report import Report, recorder
from pytest_zero3.world import World

PLUGIN_NAME = "zero3-session"
#: The key of a pytest-xdist worker's ``workerinput`` that holds the path of the baseline's results.
BASELINE_INPUT = "zero3_baseline_report"
_ASKED: pytest.StashKey[bool] = pytest.StashKey()
_WORKERS: pytest.StashKey[int] = pytest.StashKey()
#: Most pytest-xdist workers a whole-suite run starts by itself: each holds a forkserver (torch and
#: deepspeed imported, about 0.6 GB) and runs worlds of ``--zero3-world-size`` ranks.
MAX_WORKERS = 4
#: Arguments by which the user chose how the run is distributed (or asked for a debugger, or for a
#: torchrun launch): then the run is left as asked.
_DISTRIBUTION_ARGS = ("-n", "--numprocesses", "--dist", "-d", "--tx", "--pdb", "--trace", "--zero3-launcher")


def pytest_addoption(parser):
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """``pytest --zero3-impl=SPEC`` with no test path runs the conformance suite, from any directory
    (also where an ini file's ``testpaths`` would pick other tests); given paths are left alone.  A run
    that names the suite (``zero3-conformance``) is asked too, so its header shows what is under test;
    ``zero3_*`` ini settings alone ask for nothing: a bare ``pytest`` in a fork runs the fork's tests."""
    early_config.stash[_ASKED] = options.names_suite(args)
    whole = False
    if any(str(a).startswith("--zero3-") for a in args) and not early_config.known_args_namespace.file_or_dir:
        args.append(os.path.dirname(registry.path()))
        whole = True
    workers = _default_workers(early_config, args, whole)
    if workers:
        args += ["-n", str(workers), "--dist", "loadgroup"]
        early_config.stash[_WORKERS] = workers


def _default_workers(early_config, args, whole: bool) -> int:
    """How many pytest-xdist workers a run of the whole suite starts when the user chose none: one more
    than the cores this process may use, at most :data:`MAX_WORKERS`; 0 leaves the run as it is.

    Why: a world spends much of its time in gloo's waits (a 2-rank collective costs hundreds of
    microseconds of thread hand-offs on a virtual CPU), so one world leaves a third of two cores idle;
    worlds side by side fill them (the default suite on 2 cores, 2026-12-05: 68 s serially, 55 s on two
    workers, 50 s on three).  ``--dist loadgroup`` keeps the batched families (the rule batch, the zoo) in one world
    each where the installed pytest-xdist can group (not 3.8 under pytest 9.2, whose node ids it cannot
    suffix; those families then run each test in a world of its own).  Only a whole-suite run (no test
    path, or the suite's own path) on the CPU without ``--zero3-strict`` is changed; ``-n 0`` runs
    serially; a pytest started inside an xdist worker (``PYTEST_XDIST_WORKER``) never nests workers."""
    if not (whole or _names_only_the_suite(early_config)):
        return 0
    if os.environ.get("PYTEST_XDIST_WORKER") or hasattr(early_config, "workerinput"):
        return 0
    if not early_config.pluginmanager.hasplugin("xdist"):
        return 0
    for arg in map(str, args):
        name = arg.split("=")[0]
        if name in _DISTRIBUTION_ARGS or (arg.startswith("-n") and not arg.startswith("--")):
            return 0
        if name == "--zero3-backend" and arg.partition("=")[2] not in ("gloo", "auto", ""):
            return 0
    if not _worlds_on_the_cpu() or _strict(early_config, args):
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(MAX_WORKERS, cores + 1) if cores >= 2 else 0


def _strict(early_config, args) -> bool:
    """Whether ``--zero3-strict`` (or its ini setting) is on: it fails a listed contract of several tests
    when all of them pass, counting one process's tests, so the run stays in one process.  (Grouping
    them with ``xdist_group`` does not help under pytest 9.2: pytest-xdist 3.8 can no longer put the
    group into a test's node id, so ``--dist loadgroup`` splits groups.)"""
    return "--zero3-strict" in map(str, args) or bool(early_config.getini("zero3_strict"))


def _worlds_on_the_cpu() -> bool:
    """Whether the worlds will run on the CPU: each GPU world takes every device, so two at once would
    share them; there the run stays serial (without importing torch to ask: DeepSpeed's accelerator
    variable, else whether the machine has an NVIDIA device node)."""
    chosen = os.environ.get(accel.ENV, "")
    if chosen:
        return chosen == "cpu"
    return not os.path.exists("/dev/nvidiactl")


def _names_only_the_suite(early_config) -> bool:
    """Whether the run's only test path is the conformance suite itself (``zero3-conformance``,
    ``pytest --pyargs pytest_zero3.conformance``, ``pytest conformance/``), with a ``--zero3-*`` option."""
    paths = [str(p) for p in early_config.known_args_namespace.file_or_dir]
    if len(paths) != 1 or not early_config.stash.get(_ASKED, False):
        return False
    return paths[0] == "pytest_zero3.conformance" or os.path.realpath(paths[0]) == options.suite_dir()


def pytest_configure(config):
    markers.register(config)
    session = Zero3Session(config)
    config.pluginmanager.register(session, PLUGIN_NAME)
    if config.stash.get(_ASKED, False) or options.asked(config):
        session.activate()


def _session(config) -> Zero3Session:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


class Zero3Session:
    """Everything one pytest session knows about zero3: settings, the report, what it changed."""

    def __init__(self, config):
        self.config = config
        self.settings: options.Settings | None = None
        self.report: Report | None = None  # set by activate(): the session is in use
        self._undo: list[Callable[[], object]] = []  # callables restoring what start() changed, newest last
        self._env_set: list[str] = []  # environment variables start() set (not the user's)
        self._started = False
        self._baseline_dir: tempfile.TemporaryDirectory | None = None  # the baseline's report, for xdist workers
        self._markers_unreadable = False  # a marker was a usage error: nothing reads them again
        self._zygote_held: contextlib.ExitStack | None = None  # an xdist controller's shared zygote

    # -- life cycle ------------------------------------------------------------------------------
    def activate(self) -> options.Settings:
        """Validate the options and open the report (a :class:`pytest.UsageError` names the fix)."""
        if self.settings is not None:
            return self.settings
        settings = options.settings_from(self.config)
        if markers.distributing(self.config):  # its workers collect; a usage error there is an internal error
            markers.check_select(settings.select)
        if settings.baseline is not None and launcher.active():
            raise pytest.UsageError(
                "--zero3-baseline starts a pytest run of its own, which cannot share this launcher's ranks: "
                "run the verdict without torchrun (the plugin starts the worlds itself)."
            )
        if settings.spec.kind == "class":
            # Checked before any world starts; importing the user's module may import deepspeed.
            self.start(settings.world_size, settings)
            try:
                impl.load_class(settings.spec)
            except impl.SpecError as exc:
                raise pytest.UsageError(str(exc)) from None
        reports = not hasattr(self.config, "workerinput") and not (launcher.active() and launcher.rank() != 0)
        self.report = Report(self.config, settings, reports=reports)
        given = getattr(self.config, "workerinput", {}).get(BASELINE_INPUT)
        if given:  # a pytest-xdist worker: the controller ran the baseline
            self.report.use_baseline(baseline.load(given))
        self.settings = settings
        return settings

    def start(self, size: int, settings: options.Settings) -> None:
        """First use (a world of ``size`` ranks): what the ranks need from this process; each change is
        undone by :meth:`stop`.  ``DS_ACCELERATOR`` is set only where the user left it unset and the
        backend implies an accelerator (:func:`pytest_zero3.accel.chosen`)."""
        if self._started:
            return
        self._started = True
        accelerator = accel.chosen(settings.backend, size)
        if accelerator is not None:
            self._setdefault_env(accel.ENV, accelerator)
        self._setdefault_env("TORCH_EXTENSIONS_DIR", impl.extensions_dir(settings.spec))
        path = impl.import_path(settings.spec)
        if path and sys.path[:1] != [path]:
            sys.path.insert(0, path)
            self._undo.append(lambda: sys.path.remove(path) if path in sys.path else None)
        if not launcher.active():
            if hasattr(signal, "SIGTERM"):
                previous = signal.getsignal(signal.SIGTERM)
                spawner.install_signal_handlers()
                self._undo.append(lambda: _restore_signal(signal.SIGTERM, previous))
            atexit.register(spawner.kill_all)
            self._undo.append(lambda: atexit.unregister(spawner.kill_all))
        elif not self.config.pluginmanager.has_plugin(launcher.SessionEnd.NAME):  # no rank ends before rank 0 reported
            self.config.pluginmanager.register(launcher.SessionEnd(), launcher.SessionEnd.NAME)

    def stop(self) -> None:
        """End of session: stop every rank and the forkserver, then undo :meth:`start` in reverse."""
        if not self._started:
            return
        spawner.kill_all()
        while self._undo:
            self._undo.pop()()
        self._started = False

    def _setdefault_env(self, key: str, value: str) -> None:
        if key not in os.environ:
            os.environ[key] = value
            self._env_set.append(key)
            self._undo.append(lambda: os.environ.pop(key, None))
            self._undo.append(lambda: self._env_set.remove(key))

    def world(self, request, tmp_path_factory):
        settings = self.activate()
        size = markers.world_size(request.node, settings.world_size)
        timeout = markers.timeout(request.node, settings.timeout)
        backend = settings.backend  # "auto": each rank asks its accelerator (accel.backend)
        self.start(size, settings)
        record = recorder(request.node)
        if launcher.active():
            return launcher.LauncherWorld(settings.spec, backend, timeout, on_outcomes=record)
        base = str(tmp_path_factory.mktemp("zero3-world"))
        return World(
            size,
            backend,
            timeout,
            settings.spec,
            base,
            preload=markers.preloads(request.config),
            on_outcomes=record,
            startup_timeout=settings.startup_timeout,
        )

    def run_baseline(self) -> None:
        """``--zero3-baseline``: run the same contracts on the baseline first (in the process that
        reports: not in an xdist worker, which reads the results the controller passes it)."""
        settings = self.settings
        if settings is None or settings.baseline is None or self.report is None or hasattr(self.config, "workerinput"):
            return
        if self.config.option.collectonly:  # nothing runs, so nothing is judged
            return
        self._baseline_dir = tempfile.TemporaryDirectory(prefix="zero3-baseline-")
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        write = tr.write_line if tr is not None else (lambda line: None)
        doc = baseline.run(self.config, settings.baseline, self._baseline_dir.name, write, drop_env=self._env_set)
        self.report.use_baseline(doc)

    # -- hooks -------------------------------------------------------------------------------------
    def pytest_report_header(self, config):
        if self.report is None:
            return None
        lines = self.report.header_lines()
        workers = config.stash.get(_WORKERS, 0)
        if workers:
            lines = [*lines, f"zero3 workers: {workers} (pytest-xdist, for a whole-suite run; -n 0 runs serially)"]
        return lines

    def probe_config(self) -> None:
        """``--zero3-config``: before any test (and before the baseline's run), one world builds one engine
        of a small model under the overlay; where the implementation refuses it at ``initialize`` the
        session is one usage error naming the key and the implementation's words
        (:func:`pytest_zero3.fixtures.pytest_side.profile_options.refusal`), not a failure per contract.  Only in the
        process that runs the session (not an xdist worker: the controller probed) and not under a
        launcher (the ranks are this process's peers); ``--collect-only`` runs nothing, so probes nothing."""
        settings = self.settings
        if settings is None or not settings.config or hasattr(self.config, "workerinput") or launcher.active():
            return
        if self.config.option.collectonly:
            return
        from pytest_zero3.fixtures.pytest_side import (
            profile_options,  # lazy: loaded only by a session given --zero3-config
        )

        self.start(settings.world_size, settings)
        with tempfile.TemporaryDirectory(prefix="zero3-probe-") as base:
            world = World(
                settings.world_size,
                settings.backend,
                settings.timeout,
                settings.spec,
                base,
                preload=profile_options.probe_preload(settings),
                startup_timeout=settings.startup_timeout,
            )
            problem = profile_options.refusal(world, settings)
        if problem:
            raise pytest.UsageError(problem)

    def pytest_sessionstart(self, session):
        self.probe_config()
        self.run_baseline()
        self._share_zygote_with_workers()

    def _share_zygote_with_workers(self) -> None:
        """A pytest-xdist controller starts one zygote (torch imported once) before its workers start
        (xdist's own ``pytest_sessionstart`` runs last), and names it in their environment: each
        worker's forkserver forks from it and imports only deepspeed, where each imported torch for
        itself (about 4 s of CPU per worker).  Nothing changes where an outer process already shares
        one (this repository's tests) or where sharing is not possible; the zygote goes at the end of
        the session (:meth:`pytest_unconfigure`)."""
        if self.report is None or launcher.active() or not markers.distributing(self.config):
            return
        from pytest_zero3 import zygote  # lazy: its import adds an atexit hook

        if zygote.shared() is not None or not zygote.can_share():
            return
        self._zygote_held = contextlib.ExitStack()
        self._zygote_held.enter_context(spawner.held())
        spawner.share_zygote()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """pytest-xdist: each worker reads the baseline's results the controller saved."""
        if self._baseline_dir is not None:
            node.workerinput[BASELINE_INPUT] = os.path.join(self._baseline_dir.name, "baseline.json")

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        try:
            markers.check(items)
        except pytest.UsageError:
            self._markers_unreadable = True  # pytest still ends the collection (pytest_collection_finish)
            raise
        if self.report is None and any(_uses_zero3(item) for item in items):
            self.activate()
        if self.report is None:
            return
        self.report.check_expectations(items)
        markers.select_contracts(config, items)
        markers.collect_preloads(config, items)

    def pytest_collection_finish(self, session):
        if self._markers_unreadable:  # the usage error says why; reading them again here would turn
            return  # it into an INTERNALERROR
        if self.report is not None:  # the tests that will run: after -k and --zero3-select deselected
            self.report.mark_expected(session.items)

    def pytest_runtest_teardown(self, item):
        if self.report is not None:
            self.report.strict_teardown(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """A listed contract's failure becomes a KnownFailure when its cause is the listed one (its
        xfail mark expects that type), else a CauseMismatch: pytest then makes XFAIL or FAIL."""
        listed = self.report.expectation(item) if self.report is not None else None
        if listed is None:
            return (yield)
        try:
            return (yield)
        except BaseException as exc:
            cid, expectation = listed
            judged = expectations.judge(cid, expectation, exc)
            if judged is None:
                raise
            raise judged from exc

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        """Read the outcome pytest made (outermost: after its xfail handling) into the report's row."""
        rep = yield
        if self.report is not None:
            self.report.on_report(item, call, rep)
        return rep

    def pytest_runtest_logreport(self, report):
        if getattr(report, "zero3", None):  # also from an xdist worker: the controller collects nothing
            self.activate()
            assert self.report is not None
            self.report.add(report)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if self.report is not None:
            self.report.terminal_summary(terminalreporter)

    def pytest_sessionfinish(self, session, exitstatus):
        if self.report is not None:
            self.report.session_finish(session)

    def pytest_unconfigure(self, config):
        self.stop()
        if self._zygote_held is not None:
            self._zygote_held.close()  # stops the zygote and takes its name out of the environment
            self._zygote_held = None
        if self._baseline_dir is not None:
            self._baseline_dir.cleanup()
            self._baseline_dir = None


def _uses_zero3(item) -> bool:
    return "zero3_world" in getattr(item, "fixturenames", ()) or item.get_closest_marker("zero3_contract") is not None


def _restore_signal(signum, handler) -> None:
    try:
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    except ValueError:
        pass  # not the main thread


@pytest.fixture
def zero3_world(request, tmp_path_factory):
    """A fresh torch.distributed world per ``run`` call, under the implementation chosen by ``--zero3-impl``.

    ``zero3_world.run(fn, *args, **kwargs)`` runs the module-level function ``fn`` on every rank and
    returns the per-rank results.  ``@pytest.mark.zero3_world_size(n)`` and
    ``@pytest.mark.zero3_timeout(seconds)`` override the world size and the timeout for one test.
    """
    return _session(request.config).world(request, tmp_path_factory)


@pytest.fixture
def zero3_judge():
    """``zero3_judge(engine, every=1)``: :func:`pytest_zero3.judge` on an engine this test builds in its own
    process (a single-process world, or each rank of a torchrun-launched pytest).

    Used as ``with zero3_judge(engine) as j:``, the block's exit fails the test with every violation;
    a judge attached without ``with`` is detached and checked at teardown (an error of the test).
    Inside a ``zero3_world`` scenario (another process) call :func:`pytest_zero3.judge` itself.
    """
    judges: list = []

    def attach(engine, every: int = 1, check: bool = True, config=None):
        j = judging.judge(engine, every=every, check=check, config=config).attach()
        judges.append(j)
        return j

    yield attach
    for j in judges:
        attached = j.attached
        j.detach()
        if attached and j.check:
            j.assert_clean()
