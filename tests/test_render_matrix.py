"""The release-matrix renderer (scripts/render_matrix.py) on hand-made reports: no worlds, milliseconds.

Checks what a reader of the README table relies on: a known failure shows as FAIL linked to its
message, the first release whose outcome changed is named, a release that could not run is a column
saying why, and only the marked block of the README is rewritten.
"""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "render_matrix.py"


@pytest.fixture(scope="module")
def render():
    spec = importlib.util.spec_from_file_location("render_matrix", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(version, outcomes):
    rows = [
        dict(
            id=cid,
            family=cid.split("-")[0],
            statement=f"statement of {cid}",
            outcome=out,
            reason="listed reason" if out == "known failure" else f"why {cid}",
            message=f"AssertionError: {cid} on {version}" if out in ("FAIL", "known failure") else "",
            duration=0.1,
            tests=[],
            ranks=[],
        )
        for cid, out in outcomes.items()
    ]
    summary = {
        k: sum(r["outcome"] == k for r in rows)
        for k in ("pass", "FAIL", "unsupported", "known failure", "unexpected pass", "skipped")
    }
    summary["total"] = len(rows)
    return dict(
        schema="pytest-zero3/report",
        version=1,
        summary=summary,
        contracts=rows,
        implementation=dict(deepspeed=version, torch="2.13.0", backend="gloo", world_size=2),
    )


def test_matrix_in_readme_and_messages(render, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    for v, outcomes in {
        "0.19.2": {"002-a": "known failure", "003-a": "unsupported"},
        "0.19.10": {"002-a": "pass", "003-a": "unsupported"},
    }.items():
        (reports / f"deepspeed-{v}.json").write_text(json.dumps(_report(v, outcomes)))
        (reports / f"deepspeed-{v}.status.json").write_text(
            json.dumps(
                dict(torch="2.13.0", default_torch="2.13.0", exit="0", expectations=f"deepspeed-{v}.toml", seconds="5")
            )
        )
    (reports / "deepspeed-0.15.4.status.json").write_text(
        json.dumps(
            dict(torch="2.13.0", default_torch="2.13.0", error="import deepspeed fails on torch 2.13.0: ImportError: x")
        )
    )
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- release-matrix:start -->\nold table\n<!-- release-matrix:end -->\nafter\n")

    render.main(["0.19.10", "0.19.2", "0.15.4", "--reports", str(reports), "--readme", str(readme)])

    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    header = next(line for line in text.splitlines() if line.startswith("| contract"))
    # Version order, not string order; the release that did not run says why.
    assert header.index("0.15.4") < header.index("0.19.2") < header.index("0.19.10")
    assert "not run: import deepspeed fails on torch 2.13.0: ImportError: x" in header
    row = next(line for line in text.splitlines() if line.startswith("| `002-a`"))
    assert "[FAIL](docs/release-matrix.md#ds-0-19-2-002-a)" in row and row.endswith("| 0.19.10: FAIL → pass |")
    row = next(line for line in text.splitlines() if line.startswith("| `003-a`"))
    assert row.endswith("| same in every release |")
    details = (tmp_path / "docs" / "release-matrix.md").read_text()
    assert '<a id="ds-0-19-2-002-a"></a>' in details
    assert "Known failure: listed reason" in details and "AssertionError: 002-a on 0.19.2" in details


def test_readme_without_markers_names_the_fix(render, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="release-matrix:start"):
        render.main(["0.19.2", "--reports", str(tmp_path), "--readme", str(readme)])
