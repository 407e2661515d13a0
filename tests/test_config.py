"""Configuration (issues 23 and 24): one option table for the command line and the ini file, the
command line over the ini file, ini paths relative to the ini file, and every value and marker argument
checked before any world starts.

Cost: in-process pytester runs that start no world (well under a second each), two short subprocess
runs, and one ``zero3-conformance`` run of one fast contract (one 2-rank world).
"""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from pytest_zero3 import options, registry

USAGE = pytest.ExitCode.USAGE_ERROR
# In-process runs inside an xdist worker: pytest-benchmark's notice that it is off is no finding here.
pytestmark = pytest.mark.filterwarnings("ignore:Benchmarks are automatically disabled")
TRIVIAL = "def test_one():\n    pass\n"


def test_one_table_makes_the_options_the_ini_settings_and_the_frozen_settings(pytester):
    """Why: a default or a name written twice drifts; the settings are read, never changed."""
    out = pytester.runpytest_inprocess("--help").stdout.str()
    for opt in options.OPTIONS:
        assert opt.flag in out and f"{opt.ini} " in out, opt.name
    names = {o.name for o in options.OPTIONS} - {"impl"}  # the implementation is the parsed spec
    assert {f.name for f in dataclasses.fields(options.Settings)} == names | {"spec"}
    manual = (ROOT / "docs" / "reference" / "options.md").read_text()  # its table is generated from OPTIONS
    for opt in options.OPTIONS:
        assert f"- `{opt.flag}" in manual, f"docs/reference/options.md does not describe {opt.name}"
    settings = options.Settings(None, **{o.name: o.default for o in options.OPTIONS if o.name != "impl"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.world_size = 3


INI_FILES = {
    "pyproject.toml": '[tool.pytest.ini_options]\nzero3_backend = "gloo"\nzero3_world_size = 3\nzero3_timeout = "7.5"\n',
    "tox.ini": "[pytest]\nzero3_backend = gloo\nzero3_world_size = 3\nzero3_timeout = 7.5\n",
}


@pytest.mark.parametrize("name", sorted(INI_FILES))
def test_ini_settings_apply_and_the_command_line_wins(pytester, name):
    """Why: a fork's CI sets the implementation, the world size or the timeout in its ini file."""
    (pytester.path / name).write_text(INI_FILES[name])
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-world-size=1", "--co")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(["zero3: backend=gloo, world size=1, timeout=7.5s"])


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest's native [tool.pytest] table is pytest 9's")
def test_native_toml_values_are_accepted(pytester):
    pytester.makepyprojecttoml("[tool.pytest]\nzero3_world_size = 3\nzero3_timeout = 9\nzero3_backend = 'gloo'\n")
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-shrink=6", "--co")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(["zero3: backend=gloo, world size=3, timeout=9s"])


def test_ini_paths_are_relative_to_the_ini_file(pytester, monkeypatch):
    """Why: a fork writes zero3_impl = "." and zero3_expect = "ci/expect.toml" once, and runs pytest
    from any directory below its root."""
    root = pytester.path
    fork = root / "fork"
    (fork / "deepspeed").mkdir(parents=True)
    (fork / "deepspeed" / "__init__.py").write_text("")
    (fork / "version.txt").write_text("0.20.1\n")
    (root / "ci").mkdir()
    (root / "ci" / "expect.toml").write_text('[expected_failures]\n"000-a" = "known"\n')
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nzero3_impl = "fork"\nzero3_expect = "ci/expect.toml"\n')
    sub = root / "sub"
    sub.mkdir()
    (sub / "test_trivial.py").write_text(TRIVIAL)
    monkeypatch.chdir(sub)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-shrink=6", "--co")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(
        [f"zero3: impl={fork} (deepspeed fork at {fork})", f"zero3: deepspeed 0.20.1 from {fork}*"]
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        ("installed", "installed"),
        ("reference", "reference"),
        (".", "/fork"),
        ("../DeepSpeed", "/DeepSpeed"),
        ("ci/my_coordinator.py:Mine", "/fork/ci/my_coordinator.py:Mine"),
        ("my_pkg.coordinator:Mine", "my_pkg.coordinator:Mine"),  # a module: found on the import path
        ("/abs/DeepSpeed", "/abs/DeepSpeed"),
    ],
)
def test_an_ini_impl_is_resolved_against_the_ini_files_directory(value, expected):
    assert options._spec_from("/fork", value) == expected


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("timeout", "inf", "give a finite number of seconds, not 'inf'"),
        ("timeout", "nan", "give a finite number of seconds, not 'nan'"),
        ("timeout", "0", "give a positive number of seconds, not '0'"),
        ("startup_timeout", "inf", "give a finite number of seconds"),
        ("startup_timeout", "-1", "give a positive number of seconds"),
        ("world_size", "0", "a world needs at least 1 rank"),
        ("world_size", "two", "give a whole number of ranks, not 'two'"),
        ("select", ",", "no empty entry"),
        ("select", "000,,001", "no empty entry"),
        ("backend", "NCCL", "or a torch.distributed backend's name such as gloo, nccl"),
        ("strict", "maybe", "give true or false"),
        ("poison", "maybe", "give on or off, not 'maybe' (--zero3-poison=off turns it off"),
        ("shrink", "-1", "give at least 0 worlds"),
        ("impl", " ", "give a value"),
    ],
)
def test_every_value_is_checked_by_its_option(name, value, message):
    """The table's parsers: the same check for a command-line and an ini value."""
    (opt,) = [o for o in options.OPTIONS if o.name == name]
    with pytest.raises(ValueError, match=re.escape(message)):
        opt.parse(value)


POISON_OFF = "zero3: profiles: fp32; uninitialised memory not filled with NaN (--zero3-poison=off)"


@pytest.mark.parametrize(
    "args, ini, off",
    [
        ((), "", False),
        (("--zero3-poison",), "", False),  # the bare flag of earlier releases: on, as the default
        (("--zero3-poison=on",), "", False),
        (("--zero3-poison=off",), "", True),
        (("--zero3-poison", "off"), "", True),
        ((), "zero3_poison = off\n", True),
        (("--zero3-poison=on",), "zero3_poison = false\n", False),  # the command line wins
    ],
)
def test_poison_is_on_unless_turned_off_and_off_is_named(pytester, args, ini, off):
    """Why: a gate that leaves uninitialised memory as the allocator hands it sees a padding read only by
    luck, so every run fills it unless told not to, and a run told not to says so in its header."""
    if ini:
        (pytester.path / "tox.ini").write_text("[pytest]\n" + ini)
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-impl=installed", "--co", *args)
    assert result.ret == 0, result.outlines
    assert (POISON_OFF in result.stdout.str()) is off, result.outlines


def test_a_bare_poison_flag_before_a_path_is_a_usage_error_naming_the_fix(pytester):
    """Why: the flag's value is optional, so a bare ``--zero3-poison`` takes the next argument; a path
    there must say how to write it, not run without the path."""
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("--zero3-poison", "test_trivial.py")
    assert result.ret == USAGE
    assert "write --zero3-poison=on before a path" in result.stderr.str()


def test_bad_values_are_usage_errors_before_collection_and_ini_ones_only_where_the_plugin_is_used(pytester):
    """Why: the error names the option (or the setting and its file) and the fix; a run that does
    not use the plugin (a fork's own tests) is not stopped by the fork's zero3 settings."""
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-timeout=inf")
    assert result.ret == USAGE, result.outlines
    assert "argument --zero3-timeout: give a finite number of seconds, not 'inf'" in result.stderr.str()
    assert "collected" not in result.stdout.str()
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nzero3_timeout = "inf"\n')
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-shrink=6")
    assert result.ret == USAGE, result.outlines
    assert "zero3_timeout in pyproject.toml = " in result.stderr.str()
    assert "give a finite number of seconds" in result.stderr.str()
    assert "collected" not in result.stdout.str()
    assert pytester.runpytest_inprocess("test_trivial.py").ret == 0


def test_select_matching_no_contract_is_a_usage_error_listing_the_families(pytester):
    """Why: a typo in --zero3-select used to deselect everything and report only "59 deselected"."""
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-select=000,zzz,base_a")
    assert result.ret == USAGE, result.outlines
    families = ", ".join(sorted({registry.family(cid) for cid in registry.load()}))
    err = result.stderr.str()
    assert "--zero3-select: no contract ID starts with 'zzz', 'base_a'" in err, err
    assert f"the families are: {families}" in err, err
    result = pytester.runpytest_inprocess("test_trivial.py", "--zero3-select=zzz", "-n", "2")
    assert result.ret == USAGE, result.outlines  # checked before any xdist worker starts
    assert "no contract ID starts with 'zzz'" in result.stderr.str()


def test_select_accepts_a_collected_contract_of_ones_own(pytester):
    pytester.makepyfile(
        test_mine="import pytest\n\n"
        "@pytest.mark.zero3_contract('mine-a', statement='my rule holds')\n"
        "def test_mine():\n    pass\n\n" + TRIVIAL
    )
    result = pytester.runpytest_inprocess("test_mine.py", "--zero3-select=mine")
    assert result.ret == 0, result.outlines
    result.assert_outcomes(passed=1, deselected=1)


def test_marker_arguments_are_checked_at_collection_naming_the_test(pytester):
    """Why: zero3_world_size("2") or zero3_timeout(float("inf")) used to fail (or hang) only
    inside a world, as pytest-timeout checks its marker up front."""
    pytester.makepyfile(
        test_marks="""
        import pytest

        @pytest.mark.zero3_world_size(0)
        def test_zero(): pass

        @pytest.mark.zero3_world_size("2")
        def test_text(): pass

        @pytest.mark.zero3_world_size(2, 3)
        def test_two(): pass

        @pytest.mark.zero3_timeout(float("inf"))
        def test_inf(): pass

        @pytest.mark.zero3_timeout(-1)
        def test_negative(): pass

        @pytest.mark.zero3_world_size(3)
        @pytest.mark.zero3_timeout(1.5)
        def test_good(): pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == USAGE, result.outlines
    err = result.stderr.str()
    for name, fix in [
        ("test_zero", "give a positive whole number of ranks"),
        ("test_text", "give a positive whole number of ranks"),
        ("test_two", "takes one argument, e.g. zero3_world_size(2); got (2, 3)"),
        ("test_inf", "give a positive, finite number of seconds"),
        ("test_negative", "give a positive, finite number of seconds"),
    ]:
        assert f"test_marks.py::{name}: @pytest.mark.zero3_" in err and fix in err, (name, err)
    assert "test_good" not in err


@pytest.mark.slow
def test_a_forks_ini_configures_zero3_conformance_and_leaves_bare_pytest_alone(tmp_path, warm_forkserver):
    """Issue 24's fork: its pyproject.toml sets the implementation, the expectations file, the report
    and one fast contract under [tool.pytest.ini_options]; `zero3-conformance` with no arguments there
    runs the suite with them, a bare `pytest` there runs the fork's own tests only, with no zero3 output."""
    fork = tmp_path / "fork"
    (fork / "tests").mkdir(parents=True)
    (fork / "ci").mkdir()
    (fork / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\nzero3_impl = "reference"\n'
        'zero3_expect = "ci/expect.toml"\nzero3_report = "ci/report.json"\nzero3_select = "000-c"\n'
    )
    (fork / "ci" / "expect.toml").write_text('[expected_failures]\n"000-c" = "listed by the fork"\n')
    (fork / "tests" / "test_own.py").write_text("def test_own():\n    print('OWN TEST RAN')\n")
    env = dict(os.environ, DS_ACCELERATOR="cpu")  # as the tests run: its forkserver forks from their zygote

    def run(*args):
        proc = subprocess.run(
            [sys.executable, *args, "-p", "no:cacheprovider", "-s"],
            cwd=fork,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return proc.returncode, proc.stdout + proc.stderr

    code, out = run("-m", "pytest")
    assert code == 0, out
    assert "tests/test_own.py" in out and "OWN TEST RAN" in out and "1 passed" in out
    assert not [line for line in out.lower().splitlines() if "zero3" in line and not line.startswith("plugins:")]
    assert not (fork / "ci" / "report.json").exists()

    code, out = run("-m", "pytest_zero3.cli")  # zero3-conformance, no zero3 option given
    assert code == 0, out
    assert "zero3: impl=reference (reference coordinator)" in out
    assert "OWN TEST RAN" not in out and "test_own" not in out
    report = json.loads((fork / "ci" / "report.json").read_text())
    assert {c["id"]: c["outcome"] for c in report["contracts"]} == {"000-c": "unexpected_pass"}
    assert report["implementation"]["spec"] == "reference"
