"""The package's layers: named in pytest_zero3/__init__.py, checked by import-linter (pyproject.toml).

CI runs the check itself (``scripts/lint_imports.py``); this keeps the two lists the same.
"""

import pathlib
import re

import pytest_zero3
from pytest_zero3._compat import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_package_names_the_layers_that_import_linter_checks():
    """Why: a newcomer reads which layer a module belongs to in the package's docstring; CI checks the
    contract's list."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        contracts = tomllib.load(fh)["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    checked = [sorted(m.strip(" ()") for m in layer.split(":")) for layer in layers]
    items = re.findall(r"^\d\. (.*?)(?=^\d\. |^$)", pytest_zero3.__doc__ or "", re.MULTILINE | re.DOTALL)
    named = [sorted(re.findall(r"``(\w+)``", item)) for item in items]
    assert named == checked


def test_the_rank_functions_the_pytest_side_names_exist():
    """Why: the pytest side hands worlds their rank functions by name (``job.Named``), which no import
    checks; a renamed function would fail only in a world (and the config probe reads a failure as "no
    refusal").  Read from the source, not imported: the targets import torch."""
    import ast
    import importlib.util

    from pytest_zero3.fixtures import profiles
    from pytest_zero3.fixtures.pytest_side import profile_options, rule_batch, seq_batch

    from pytest_zero3.job import Named

    modules = (profiles, profile_options, rule_batch, seq_batch)
    named = [v for m in modules for v in vars(m).values() if isinstance(v, Named)]
    assert len(named) == 4, named
    for target in named:
        spec = importlib.util.find_spec(target.module)
        assert spec is not None and spec.origin, target
        tree = ast.parse(pathlib.Path(spec.origin).read_text())
        assert target.name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, target
