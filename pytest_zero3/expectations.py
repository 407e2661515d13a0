"""The expectations file: contract IDs known to fail for one implementation, each with a reason.

TOML, comments allowed::

    # deepspeed 0.19.8
    [expected_failures]
    "000-a" = "prefetch-skip retention keeps forward-gathered params until backward (PR 9003)"

A listed failure does not fail the run; a listed contract that passes is an "unexpected pass"
(an error under ``--zero3-strict``); an ID that matches no collected contract is a warning.
"""

from __future__ import annotations


import pytest

from pytest_zero3._compat import tomllib


def load(path) -> dict:
    """``{contract_id: reason}`` from ``path``; :class:`pytest.UsageError` if the file is unusable."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise pytest.UsageError(f"--zero3-expect={path}: no such file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise pytest.UsageError(
            f"--zero3-expect={path}: not valid TOML ({exc}). Write one line per contract "
            'under [expected_failures]: "000-a" = "reason".'
        ) from None
    table = data.get("expected_failures")
    if not isinstance(table, dict):
        raise pytest.UsageError(
            f'--zero3-expect={path}: needs an [expected_failures] table of "contract-id" = "reason" lines.'
        )
    bad = [k for k, v in table.items() if not isinstance(v, str) or not v.strip()]
    if bad:
        raise pytest.UsageError(f"--zero3-expect={path}: give a non-empty reason string for {', '.join(bad)}.")
    return dict(table)
