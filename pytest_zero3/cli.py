"""``zero3-conformance [pytest args]``: the conformance suite from an installed wheel, in one command.

Equivalent to ``pytest --pyargs pytest_zero3.conformance [pytest args]``, e.g.::

    zero3-conformance --zero3-impl=/path/to/DeepSpeed --zero3-expect=expect.toml --zero3-report=r.json
"""

import sys


def main(argv=None) -> int:
    import pytest

    args = list(sys.argv[1:] if argv is None else argv)
    return int(pytest.main(["--pyargs", "pytest_zero3.conformance", *args]))


if __name__ == "__main__":
    sys.exit(main())
