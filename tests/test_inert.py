"""The plugin is a guest: a run that does not use it sees no change at all (issue 12).

Each run below records, in a JSON file, the process's environment, signal handlers, atexit hook count
and whether torch/deepspeed are imported: at session start, during a test and at the very end
(after every other ``pytest_unconfigure``).  Cost: four short pytest subprocesses and one 1-rank world.
"""

import json
import re

import pytest

PROBE_CONFTEST = """
import atexit, json, os, signal, sys
import pytest

def _state():
    handlers = {}
    for s in signal.valid_signals():
        try:
            h = signal.getsignal(s)
        except (ValueError, OSError):
            continue
        handlers[signal.Signals(s).name if s in signal.Signals._value2member_map_ else str(s)] = getattr(
            h, "__qualname__", repr(h))
    env = {k: v for k, v in os.environ.items() if k not in ("PROBE_OUT", "PYTEST_CURRENT_TEST")}
    return dict(env=env, handlers=handlers, atexit=atexit._ncallbacks(),
                zero3_atexit=[f"{h.__module__}.{h.__qualname__}" for h in HOOKS if "zero3" in h.__module__],
                heavy=sorted(m for m in ("torch", "deepspeed") if m in sys.modules))

STATES = {}
# atexit cannot list its hooks: track the ones registered from here on by name.
HOOKS = []
_register, _unregister = atexit.register, atexit.unregister

def _tracked_register(fn, *args, **kwargs):
    HOOKS.append(fn)
    return _register(fn, *args, **kwargs)

def _tracked_unregister(fn):
    HOOKS[:] = [h for h in HOOKS if h != fn]
    return _unregister(fn)

atexit.register, atexit.unregister = _tracked_register, _tracked_unregister

def record(when):
    STATES[when] = _state()

def pytest_sessionstart(session):
    record("start")

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    record("end")
    with open(os.environ["PROBE_OUT"], "w") as fh:
        json.dump(STATES, fh)
"""

PLAIN_TEST = """
from conftest import record

def test_plain():
    record("test")
"""

WORLD_TEST = """
from conftest import record

def nothing():
    return 1

def test_world(zero3_world):
    assert zero3_world.run(nothing) == [1]
    record("test")
"""


def _run(pytester, monkeypatch, name, *args):
    out = pytester.path / f"{name}.json"
    monkeypatch.setenv("PROBE_OUT", str(out))
    # hypothesis's plugin registers an atexit hook in whichever run first creates its database.
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest", *args)
    return result, json.loads(out.read_text())


def _normalised(result) -> list:
    """The output, less what differs between any two runs: timings, and pytest's list of plugins."""
    lines = [re.sub(r"\d+\.\d+s", "Ns", line) for line in result.outlines]
    return [line for line in lines if not line.startswith("plugins:")]


def test_a_run_that_does_not_use_the_plugin_sees_no_change(pytester, monkeypatch):
    """Why: installed next to DeepSpeed's own tests (even with zero3_* settings in the fork's ini
    file), the plugin must not change their runs."""
    pytester.makeconftest(PROBE_CONFTEST)
    pytester.makepyfile(test_plain=PLAIN_TEST)
    # The entry point loads it (the package is installed, as in CI); -p no:zero3 keeps it out.
    # A first run in a fresh directory registers one more atexit hook than later ones, plugin or
    # not (measured both ways round): a warm-up run settles that before the two compared runs.
    # The run with the plugin also has a fork's zero3 ini settings (one of them unusable): settings
    # alone ask for nothing, so a fork's own tests run as without the plugin.
    ini = '[tool.pytest.ini_options]\npythonpath = ["."]\n'
    pytester.makepyprojecttoml(ini)
    _run(pytester, monkeypatch, "warm-up", "-p", "no:zero3")
    without, unseen = _run(pytester, monkeypatch, "without", "-p", "no:zero3")
    pytester.makepyprojecttoml(ini + 'zero3_impl = "reference"\nzero3_world_size = 1\nzero3_expect = "missing.toml"\n')
    with_plugin, seen = _run(pytester, monkeypatch, "with")
    assert with_plugin.ret == without.ret == 0, with_plugin.outlines
    assert _normalised(with_plugin) == _normalised(without)
    assert not any("zero3" in line.lower() for line in _normalised(with_plugin))
    for when in ("start", "test", "end"):
        for key in ("env", "handlers", "atexit", "heavy"):
            assert seen[when][key] == unseen[when][key], f"{key} differs at {when} with the plugin loaded"
    assert seen["test"]["heavy"] == []


def test_a_run_that_uses_it_undoes_its_set_up_at_session_end(pytester, monkeypatch):
    """Why: set-up (SIGTERM handler, atexit hook, extension directory) is for the session that needs
    it; pytest embedded in a longer-lived process must get its process back unchanged."""
    pytester.makeconftest(PROBE_CONFTEST)
    pytester.makepyfile(test_world=WORLD_TEST)
    result, seen = _run(pytester, monkeypatch, "used", "test_world.py", "--zero3-world-size=1", "--zero3-backend=gloo")
    assert result.ret == 0, result.outlines
    assert seen["test"]["handlers"]["SIGTERM"] != seen["start"]["handlers"]["SIGTERM"]  # it did set up
    assert seen["test"]["zero3_atexit"] == ["pytest_zero3.spawner.kill_all"]
    # Importing multiprocessing registers the standard library's own hooks, which stay (and are harmless).
    for key in ("env", "handlers", "zero3_atexit"):
        assert seen["end"][key] == seen["start"][key], f"{key} not restored at session end"


@pytest.mark.parametrize("marker", ["zero3_contract('000-a')"])
def test_a_collected_contract_alone_activates_the_plugin(pytester, marker):
    """Why: `pytest path/to/contracts.py` with no option must still produce the conformance table."""
    pytester.makepyfile(test_c=f"import pytest\n\n@pytest.mark.{marker}\ndef test_c():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*ZeRO-3 conformance*", "*000-a*pass*"])
