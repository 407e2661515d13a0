"""The README's generated tables: contracts (from conformance/contracts.toml) and proof (from tests/flags.py).

``python tests/readme.py`` rewrites them in place; ``tests/test_registry.py`` fails when they are stale.
Each table sits between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` lines.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
sys.path[:0] = [str(README.parent), str(README.parent / "tests")]  # this checkout's packages, tests/flags.py


def contracts_table() -> str:
    from pytest_zero3 import registry

    lines = ["| ID | statement | source | ranks |", "|---|---|---|---|"]
    for c in sorted(registry.load().values(), key=lambda c: (c.family == "base", c.id)):
        ranks = f"≥ {c.min_world_size}" if c.min_world_size > 1 else "any"
        lines.append(f"| {c.id} | {c.statement} | {c.source} | {ranks} |")
    return "\n".join(lines)


def proof_table() -> str:
    from flags import CASES

    lines = ["| coordinator | bug | flagged by |", "|---|---|---|"]
    for case in CASES:
        ids = ", ".join(sorted(case.flagged))
        if case.may_fail:
            ids += " (may also fail: " + ", ".join(sorted(case.may_fail - case.flagged)) + ")"
        lines.append(f"| `{case.name}` | {case.bug} | {ids} |")
    return "\n".join(lines)


TABLES = {"contracts": contracts_table, "proof": proof_table}


def section(text: str, name: str) -> str:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    return match.group(1) if match else ""


def render(text: str) -> str:
    for name, make in TABLES.items():
        table = make()
        text = re.sub(
            rf"(<!-- {name}:begin -->\n).*?(\n<!-- {name}:end -->)",
            lambda m, table=table: m.group(1) + table + m.group(2),
            text,
            flags=re.S,
        )
    return text


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
