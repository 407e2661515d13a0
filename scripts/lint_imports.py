"""``lint-imports`` (import-linter) on the package as a wheel lays it out: the layers of pytest_zero3/__init__.py.

In a checkout, conformance/, fixtures/ and reference_impl/ sit next to pytest_zero3/ and join it at run
time (pytest_zero3/__init__.py extends the package's path); grimp finds a package's modules by walking
its directory, so a bare ``lint-imports`` sees pytest_zero3/ alone.  This lays the package out as the
wheel does ([tool.setuptools.package-dir] in pyproject.toml), as symbolic links in a temporary
directory, and checks the contracts of [tool.importlinter] there.  Arguments go to ``lint-imports``.
About a second.
"""

import os
import sys
import tempfile

import tomllib  # import-linter 2.17 needs Python 3.11 too

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "pyproject.toml")


def lay_out(view: str) -> None:
    """Make ``view/pytest_zero3``: the package's modules, and each mapped folder as its subpackage."""
    with open(CONFIG, "rb") as fh:
        mapped = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    package = os.path.join(view, "pytest_zero3")
    os.mkdir(package)
    for name in os.listdir(os.path.join(ROOT, "pytest_zero3")):
        if name.endswith(".py"):
            os.symlink(os.path.join(ROOT, "pytest_zero3", name), os.path.join(package, name))
    for dotted, folder in mapped.items():
        os.symlink(os.path.join(ROOT, folder), os.path.join(view, *dotted.split(".")))


def main(args: list) -> int:
    from importlinter.cli import lint_imports_command

    with tempfile.TemporaryDirectory(prefix="zero3-lint-imports-") as view:
        lay_out(view)
        os.chdir(view)  # lint-imports puts the working directory first on the import path
        try:
            lint_imports_command.main(args=[CONFIG, "--no-cache", *args], prog_name="lint-imports")
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
