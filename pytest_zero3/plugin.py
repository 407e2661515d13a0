"""pytest entry point of pytest-zero3 (``pytest11`` entry point ``zero3``).

Thin on purpose: each hook delegates to the module that does the work.  Loading this module imports
neither torch nor deepspeed; they are imported when a zero3 test actually runs.
"""
from __future__ import annotations

import atexit

import pytest

from pytest_zero3 import launcher, markers, options, spawner

_SETTINGS = pytest.StashKey()


def pytest_addoption(parser):
    options.add_options(parser)


def pytest_configure(config):
    markers.register(config)
    config.stash[_SETTINGS] = options.settings_from(config)
    if not launcher.active():
        spawner.install_signal_handlers()
        atexit.register(spawner.kill_all)
    from pytest_zero3 import report
    report.configure(config, config.stash[_SETTINGS])


def pytest_unconfigure(config):
    spawner.kill_all()


def pytest_report_header(config):
    from pytest_zero3 import report
    return report.header_lines(config.stash[_SETTINGS])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    from pytest_zero3 import report
    report.check_expectations(config, items)
    markers.select_contracts(config, items)
    markers.collect_preloads(config, items)


@pytest.fixture
def zero3_world(request, tmp_path_factory):
    """A fresh torch.distributed world per ``run`` call, under the implementation chosen by ``--zero3-impl``.

    ``zero3_world.run(fn, *args, **kwargs)`` runs the module-level function ``fn`` on every rank and
    returns the per-rank results.  ``@pytest.mark.zero3_world_size(n)`` and
    ``@pytest.mark.zero3_timeout(seconds)`` override the world size and the timeout for one test.
    """
    from pytest_zero3 import report
    settings = request.config.stash[_SETTINGS]
    size = markers.world_size(request.node, settings.world_size)
    timeout = markers.timeout(request.node, settings.timeout)
    record = report.recorder(request.node)
    if launcher.active():
        backend = options.resolve_backend(settings, size)
        return launcher.LauncherWorld(settings.spec, backend, timeout, on_outcomes=record)
    from pytest_zero3.world import World
    backend = options.resolve_backend(settings, size)
    base = str(tmp_path_factory.mktemp("zero3-world"))
    return World(size, backend, timeout, settings.spec.text, base,
                 preload=markers.preloads(request.config), on_outcomes=record)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    from pytest_zero3 import report
    rep = yield
    report.on_report(item, call, rep)
    return rep


def pytest_report_teststatus(report, config):
    from pytest_zero3 import report as report_mod
    return report_mod.teststatus(report)


def pytest_runtest_logreport(report):
    from pytest_zero3 import report as report_mod
    report_mod.logreport(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from pytest_zero3 import report
    report.terminal_summary(terminalreporter, config)


def pytest_sessionfinish(session, exitstatus):
    from pytest_zero3 import report
    report.session_finish(session)
