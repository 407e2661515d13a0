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
