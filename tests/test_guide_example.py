"""The writing-scenarios guide's worked example is code that runs (issue 56).

Its code blocks each start with ``# append to PATH`` (the decorated scenario and its registry line): this
test appends each to that file in a copy of the checkout (the package, the scenarios, the suite and the reference) and runs the example's contract
there against the reference, so a guide that drifts from the code (a renamed helper, an import the topic
module no longer has, a registry field) fails here.  It also checks that the guide names every file a
new contract may touch.

Cost: one world of one contract in a subprocess (~20 s).
"""

from __future__ import annotations

import re
import shutil

import pytest

from conftest import ROOT
from pytest_zero3 import registry

GUIDE = ROOT / "docs" / "guides" / "writing-scenarios.md"
BLOCK = re.compile(r"^```(?:python|toml)\n# append to (\S+)\n(.*?)^```$", re.M | re.S)
#: What the copy needs to run a contract: the package and the three folders it maps into its namespace.
COPIED = ("pytest_zero3", "fixtures", "conformance", "reference_impl")
#: Every file a new contract may touch, as the guide's list names them.
TOUCHED = (
    "conformance/contracts.toml",
    "fixtures/models/",
    "tests/bad_coordinators/",
    "tests/forks.py",
    "tests/flags.py",
    "conformance/surface.toml",
    "conformance/expectations/deepspeed-*.toml",
    "README.md",
    "docs/reference/contracts.md",
)


def blocks() -> list[tuple[str, str]]:
    return [(path, code) for path, code in BLOCK.findall(GUIDE.read_text())]


def test_the_guide_names_every_file_a_new_contract_touches():
    """Why: the guide was the one place a newcomer learns what to edit, and it named two of the files."""
    text = GUIDE.read_text()
    missing = [f for f in TOUCHED if f"`{f}`" not in text]
    assert not missing, f"docs/guides/writing-scenarios.md does not name {missing}"


def test_the_example_is_one_decorated_scenario_and_one_registry_line():
    """Why: a new contract touches two files, three with its known-bad (issue 56); the guide shows it."""
    paths = [path for path, _ in blocks()]
    assert sorted(paths) == ["conformance/contracts.toml", "fixtures/parity.py"]
    assert "@contract(" in dict(blocks())["fixtures/parity.py"]


@pytest.mark.slow
def test_the_worked_example_runs_against_the_reference(run_pytest, tmp_path):
    """Why: an example nobody runs rots; this one is appended to a copy of the checkout and judged."""
    toml = dict(blocks())["conformance/contracts.toml"]
    cid = re.search(r'^\[contracts\."([\w-]+)"\]', toml, re.M).group(1)
    assert cid not in registry.load(str(ROOT / "conformance" / "contracts.toml")), (
        f"the guide's example ID {cid} is a real contract now: give the example a free ID"
    )
    copy = tmp_path / "checkout"
    for name in COPIED:
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path, code in blocks():
        with open(copy / path, "a") as f:
            f.write("\n\n" + code)
    run = run_pytest(
        "conformance",
        "--zero3-impl=reference",
        f"--zero3-select={cid}",
        cwd=copy,
        env={"PYTHONPATH": str(copy)},
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert [c["outcome"] for c in run.report["contracts"] if c["id"] == cid] == ["pass"], run.stdout[-3000:]
