"""Options: --help, bad values as usage errors before collection, the header (issue: foundation §2)."""

import pytest

USAGE = pytest.ExitCode.USAGE_ERROR


@pytest.fixture
def plain(pytester):
    """A pytester directory with one trivial test (no world), so only option handling is exercised."""
    pytester.makepyfile(test_trivial="def test_one():\n    pass\n")
    return pytester


def test_help_lists_the_zero3_group(plain):
    out = plain.runpytest_subprocess("--help").stdout.str()
    assert "ZeRO-3 conformance (pytest-zero3)" in out
    for opt in (
        "--zero3-impl=SPEC",
        "--zero3-world-size=N",
        "--zero3-backend",
        "--zero3-timeout=SECONDS",
        "--zero3-report=PATH",
        "--zero3-report-md=PATH",
        "--zero3-expect=FILE",
        "--zero3-strict",
        "--zero3-select=IDS",
    ):
        assert opt in out


def test_loading_the_plugin_imports_neither_torch_nor_deepspeed(plain):
    plain.makeconftest(
        "import sys\n"
        "def pytest_collection_finish(session):\n"
        "    print('HEAVY', sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))\n"
    )
    result = plain.runpytest_subprocess("-s")
    result.stdout.fnmatch_lines(["HEAVY []"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--zero3-impl=/no/such/dir"], "no such path"),
        (["--zero3-impl=EMPTYDIR"], "directory has no 'deepspeed/__init__.py'"),
        (["--zero3-impl=no_such_module_xyz:Coordinator"], "importing 'no_such_module_xyz' failed: ModuleNotFoundError"),
        (["--zero3-impl=impl_mod.py:not_a_class"], "'not_a_class' is a int, not a class"),
        (["--zero3-impl=impl_mod.py:Missing"], "has no attribute 'Missing'"),
        (["--zero3-impl=impl_mod.py:Partial"], "Partial lacks coordinator methods: trace_prologue, is_record_trace"),
        (["--zero3-impl=impl_mod.py"], "is a file; for a coordinator class write"),
        (["--zero3-impl=gone.py:C"], "file 'gone.py' does not exist"),
        (["--zero3-world-size=0"], "a world needs at least 1 rank"),
        (["--zero3-timeout=0"], "give a positive number of seconds"),
        (["--zero3-backend=nccl", "--zero3-world-size=64"], "--zero3-backend=nccl needs 64 GPUs"),
        (["--zero3-expect=nope.toml"], "--zero3-expect=nope.toml: no such file"),
        (["--zero3-expect=bad.toml"], "needs an [expected_failures] table"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_fix(plain, args, message):
    (plain.path / "EMPTYDIR").mkdir()
    plain.makepyfile(
        impl_mod="""
        not_a_class = 3
        class Partial:
            def reset_step(self): pass
            def fetch_sub_module(self, m, forward): pass
    """
    )
    (plain.path / "bad.toml").write_text('"000-a" = "reason outside the table"\n')
    result = plain.runpytest(*args)  # in this process: a usage error comes before any world
    assert result.ret == USAGE
    assert message in result.stderr.str()
    assert "collected" not in result.stdout.str()  # reported before collection


def test_header_names_what_is_under_test(plain):
    out = plain.runpytest_subprocess("test_trivial.py", "--zero3-impl=installed", "--co").stdout.str()
    import os

    import deepspeed  # noqa: F401  (only to find its path; this test process may import it)

    assert "zero3: impl=installed (installed deepspeed)" in out
    assert f"from {os.path.dirname(deepspeed.__file__)}" in out
    assert "backend=auto, world size=2" in out
