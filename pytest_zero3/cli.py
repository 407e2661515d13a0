"""``zero3-conformance [pytest args]``: the conformance suite from an installed wheel, in one command.

Equivalent to ``pytest --pyargs pytest_zero3.conformance [pytest args]``, e.g.::

    zero3-conformance --zero3-impl=/path/to/DeepSpeed --zero3-expect=expect.toml --zero3-report=r.json

With no arguments, in a fork whose ``pyproject.toml`` sets ``zero3_impl = "."`` and ``zero3_expect``
under ``[tool.pytest.ini_options]``, it runs the suite with those settings.

``zero3-conformance bisect GOOD BAD [pytest args]`` and ``zero3-conformance bisect-step [pytest args]``
find the commit of a fork that broke a contract (:mod:`pytest_zero3.gitbisect`).
"""

import sys
from typing import Optional

import pytest

from pytest_zero3 import gitbisect


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["bisect"], ["bisect-step"]):
        return gitbisect.bisect(args[1:]) if args[0] == "bisect" else gitbisect.step(args[1:])
    return int(pytest.main(["--pyargs", "pytest_zero3.conformance", *args]))


if __name__ == "__main__":
    sys.exit(main())
