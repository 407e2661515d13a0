"""What an install promises: the suite runs by default, true deepspeed version claims, one namespace.

Cost: two collections of the suite (about 10 s each: they import torch), one wheel build (a few
seconds), four option checks that start no world.
"""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

USAGE = pytest.ExitCode.USAGE_ERROR


@pytest.fixture
def other_project(pytester):
    """A directory like a DeepSpeed fork's root: its own tests/ tree, and testpaths pointing at it."""
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_theirs.py").write_text("def test_theirs():\n    assert False\n")
    return pytester


def test_zero3_option_without_paths_runs_the_suite_and_paths_are_kept(other_project):
    """Why: `pytest --zero3-impl=PATH` is the promised usage; at a fork's root it must not collect
    the fork's own tests, and with paths pytest must collect what it is given."""
    result = other_project.runpytest_subprocess(
        "-p", "no:hypothesispytest", "--zero3-impl=installed", "--zero3-select=base-a", "--co", "-q"
    )
    assert result.ret == 0, result.outlines
    out = result.stdout.str()
    assert "test_contracts.py::test_contract[base-a]" in out and "test_theirs" not in out
    result = other_project.runpytest_subprocess(
        "-p", "no:hypothesispytest", "--zero3-impl=installed", "tests/test_theirs.py", "--co", "-q"
    )
    assert "tests/test_theirs.py::test_theirs" in result.stdout.str() and "conformance" not in result.stdout.str()
    result = other_project.runpytest_subprocess("-p", "no:hypothesispytest", "--co", "-q")  # no option: theirs
    assert "tests/test_theirs.py::test_theirs" in result.stdout.str() and "conformance" not in result.stdout.str()


def _fake_deepspeed(root, version: str, checkout: bool = False):
    """A ``deepspeed`` package that reports ``version`` the way an install (or a source checkout) does."""
    pkg = root / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if checkout:
        (root / "version.txt").write_text(version + "\n")
        git = root / ".git"
        (git / "refs" / "heads").mkdir(parents=True)
        (git / "HEAD").write_text("ref: refs/heads/master\n")
        (git / "refs" / "heads" / "master").write_text("0123456789abcdef0123456789abcdef01234567\n")
    else:
        (pkg / "git_version_info_installed.py").write_text(f"version = '{version}'\n")
    return root


@pytest.mark.parametrize("impl", ["reference", "some_module:Coordinator"])
def test_reference_and_classes_need_deepspeed_0_19_3(pytester, monkeypatch, impl):
    """Why: the reference wraps DeepSpeedZeRoOffload.release_backward_leftovers (added in 0.19.3);
    on an older deepspeed that is an AttributeError in every rank, so it must be a usage error."""
    old = _fake_deepspeed(pytester.path / "old", "0.19.2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(old), str(ROOT)]))
    pytester.makepyfile(test_trivial="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("test_trivial.py", f"--zero3-impl={impl}")
    assert result.ret == USAGE, result.outlines
    assert "needs deepspeed >= 0.19.3, found 0.19.2" in result.stderr.str()


def test_plugin_floor_and_checkout_version(pytester):
    """Why: a source checkout reports 0.0.0 itself; the header must say what it really is."""
    pytester.makepyfile(test_trivial="def test_one():\n    pass\n")
    older = _fake_deepspeed(pytester.path / "older", "0.13.5", checkout=True)
    result = pytester.runpytest_subprocess("test_trivial.py", f"--zero3-impl={older}")
    assert result.ret == USAGE, result.outlines
    assert "pytest-zero3 needs deepspeed >= 0.14.0, found 0.13.5 (git 0123456789ab): its harness" in result.stderr.str()
    fork = _fake_deepspeed(pytester.path / "fork", "0.20.1", checkout=True)
    result = pytester.runpytest_subprocess("test_trivial.py", f"--zero3-impl={fork}", "--co")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines([f"zero3: deepspeed 0.20.1 (git 0123456789ab) from {fork / 'deepspeed'}, *"])
    assert "untested base" not in result.stdout.str()


@pytest.mark.parametrize(
    ("base", "oldest"),
    [("0.15.2", "the release matrix runs of 0.15, 0.15.4"), ("0.14.0", "the release matrix runs of 0.14, 0.14.5")],
)
def test_fork_on_an_older_base_runs_with_an_untested_base_warning(pytester, base, oldest):
    """Why: vendor forks live on old bases for long; they need the gate, told what was not measured,
    not a refusal they cannot follow."""
    fork = _fake_deepspeed(pytester.path / "fork", base, checkout=True)
    (fork / "deepspeed" / "__init__.py").write_text(f"__version__ = {base!r}\n")
    pytester.makepyfile(test_trivial="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("test_trivial.py", f"--zero3-impl={fork}", "--co")
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(
        [
            f"zero3: warning: untested base: deepspeed {base} (git 0123456789ab) is older than the oldest release {oldest};*"
        ]
    )


def test_matrix_releases_are_the_release_matrix_script_s():
    """Why: the untested-base warning names what the release matrix runs; one list must not drift from the other."""
    import re

    from pytest_zero3 import impl

    script = (ROOT / "scripts" / "release-matrix.sh").read_text()
    assert tuple(re.search(r"^RELEASES=\(([^)]*)\)", script, re.M).group(1).split()) == impl.MATRIX_RELEASES


def test_wheel_adds_only_pytest_zero3(tmp_path):
    """Why: a wheel that adds `fixtures` or `conformance` to site-packages overwrites other packages."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(exist_ok=True)
        (src / name).write_bytes((ROOT / name).read_bytes())
    for pkg in ("pytest_zero3", "conformance", "fixtures", "reference_impl"):
        subprocess.run(["cp", "-r", str(ROOT / pkg), str(src / pkg)], check=True)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "pytest_zero3",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }
    for needed in (
        "pytest_zero3/conformance/contracts.toml",
        "pytest_zero3/conformance/expectations/deepspeed-0.19.8.toml",
        "pytest_zero3/conformance/test_contracts.py",
        "pytest_zero3/fixtures/contract.py",
        "pytest_zero3/fixtures/reuse_window.py",
        "pytest_zero3/reference_impl/install.py",
        "pytest_zero3/plugin.py",
        "pytest_zero3/py.typed",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    # Every module of the checkout ships: a subpackage left out of pyproject.toml's packages broke the
    # installed suite at collection (fixtures/seq, the seq family's, found by the release matrix).
    for top, into in (
        ("pytest_zero3", ""),
        ("conformance", "conformance/"),
        ("fixtures", "fixtures/"),
        ("reference_impl", "reference_impl/"),
    ):
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                shipped = "pytest_zero3/" + into + path.relative_to(ROOT / top).as_posix()
                assert shipped in names, f"{shipped} missing from the wheel: list its package in pyproject.toml"
    # One version source: the wheel's version is pytest_zero3.__version__, its dependencies declared.
    import pytest_zero3

    assert wheel.name.split("-")[1] == pytest_zero3.__version__
    dist_info = wheel.name.split("-")[0] + "-" + pytest_zero3.__version__ + ".dist-info"
    meta = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert "Requires-Dist: packaging" in meta and 'Requires-Dist: tomli>=1.1; python_version < "3.11"' in meta
    assert not any("__pycache__" in n for n in names)
