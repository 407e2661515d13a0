"""The release-matrix renderer (scripts/render_matrix.py) on hand-made reports: no worlds, milliseconds.

Checks what a reader of the manual's release-matrix table relies on: a known failure shows as FAIL
linked to its message, the first release whose outcome changed is named, a release that could not run
is a column saying why, and only the marked block of the page is rewritten.
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


def _pages(root, text):
    """The manual's layout: the table's page under docs/results/, the messages in docs/release-matrix.md."""
    page = root / "docs" / "results" / "release-matrix.md"
    page.parent.mkdir(parents=True)
    page.write_text(text)
    return page, root / "docs" / "release-matrix.md"


def page_args(page, details):
    return ["--page", str(page), "--details", str(details)]


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


def test_matrix_in_the_page_and_messages(render, tmp_path):
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
    page, details = _pages(
        tmp_path, "before\n<!-- release-matrix:start -->\nold table\n<!-- release-matrix:end -->\nafter\n"
    )

    render.main(["0.19.10", "0.19.2", "0.15.4", "--reports", str(reports), *page_args(page, details)])

    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    header = next(line for line in text.splitlines() if line.startswith("| contract"))
    # Version order, not string order; the release that did not run says why.
    assert header.index("0.15.4") < header.index("0.19.2") < header.index("0.19.10")
    assert "not run: import deepspeed fails on torch 2.13.0: ImportError: x" in header
    row = next(line for line in text.splitlines() if line.startswith("| `002-a`"))
    assert "[FAIL](../release-matrix.md#ds-0-19-2-002-a)" in row and row.endswith("| 0.19.10: FAIL → pass |")
    row = next(line for line in text.splitlines() if line.startswith("| `003-a`"))
    assert row.endswith("| same in every release |")
    messages = details.read_text()
    assert '<a id="ds-0-19-2-002-a"></a>' in messages
    assert "Known failure: listed reason" in messages and "AssertionError: 002-a on 0.19.2" in messages


def test_page_without_markers_names_the_fix(render, tmp_path):
    page, details = _pages(tmp_path, "no markers\n")
    with pytest.raises(SystemExit, match="release-matrix:start"):
        render.main(["0.19.2", "--reports", str(tmp_path), *page_args(page, details)])


def _v3(version, outcomes):
    """A version-3 report, as pytest_zero3/report.py writes it."""
    doc = _report(version, {})
    words = {"FAIL": "fail", "known failure": "known_failure"}
    doc["version"] = 3
    doc["implementation"].update(spec="installed", impl="installed deepspeed")
    doc["contracts"] = [
        dict(
            id=cid,
            family=cid.split("-")[0],
            statement=f"statement of {cid}",
            source="",
            outcome=words.get(out, out),
            reason="listed reason" if out == "known failure" else "",
            message=f"AssertionError: {cid} on {version}" if out in ("FAIL", "known failure") else "",
            expected_cause="matches 'on 0'" if out == "known failure" else "",
            duration=0.1,
            tests=[],
            ranks=[],
        )
        for cid, out in outcomes.items()
    ]
    keys = ("pass", "fail", "world_error", "known_failure", "unexpected_pass", "unsupported", "skipped", "not_run")
    doc["summary"] = {k: sum(c["outcome"] == k for c in doc["contracts"]) for k in keys}
    doc["summary"]["total"] = len(doc["contracts"])
    return doc


@pytest.mark.parametrize("jsonschema", [True, False], ids=["jsonschema", "own-validator"])
def test_version_3_is_validated_against_the_shipped_schema(render, tmp_path, monkeypatch, jsonschema):
    """Why: the schema file is the report's contract; a v3 report that breaks it must not be rendered
    as if it were right, with jsonschema installed or not."""
    if not jsonschema:
        monkeypatch.setitem(__import__("sys").modules, "jsonschema", None)  # import fails: the fallback runs
    good = _v3("0.19.8", {"001-a": "known failure", "003-a": "unsupported", "base-a": "pass"})
    assert render.validate(good, render.schema()) == []
    bad = json.loads(json.dumps(good))
    bad["contracts"][0]["outcome"] = "flaky"
    del bad["summary"]["world_error"]
    problems = render.validate(bad, render.schema())
    assert any("flaky" in p for p in problems) and any("world_error" in p for p in problems), problems

    reports = tmp_path / "reports"
    reports.mkdir()
    for v, doc in {"0.19.8": good, "0.19.9": bad}.items():
        (reports / f"deepspeed-{v}.json").write_text(json.dumps(doc))
        (reports / f"deepspeed-{v}.status.json").write_text(json.dumps(dict(exit="0", expectations="x.toml")))
    page, details = _pages(tmp_path, "<!-- release-matrix:start -->\n<!-- release-matrix:end -->\n")
    render.main(["0.19.8", "0.19.9", "--reports", str(reports), *page_args(page, details)])
    text = page.read_text()
    assert "[FAIL](../release-matrix.md#ds-0-19-8-001-a)" in text
    assert "0.19.9**<br>not run: report does not match its schema" in text
    assert "Known failure: listed reason (expected cause: it matches 'on 0')" in details.read_text()


def test_the_plugin_writes_what_the_schema_says(render):
    """The renderer's schema file is the one the plugin ships and names (one place)."""
    from pytest_zero3 import report

    assert report.SCHEMA_VERSION == max(render.schema()["properties"]["version"]["enum"]) == 4
    assert pathlib.Path(report.SCHEMA_FILE).resolve() == pathlib.Path(render.SCHEMA_FILE).resolve()


def test_a_release_with_no_report_here_keeps_its_column_and_messages(render, tmp_path):
    """Why (issue 38): the reports live on the machine that ran the script, so a run of two new releases
    elsewhere could only redraw the others as "not run".  A release with no status file keeps the column
    and the messages the pages have (re-rendering them changes nothing); a release never measured is a
    column that says so; one this run measured replaces its kept column."""
    reports = tmp_path / "reports"
    reports.mkdir()
    page, details = _pages(tmp_path, "before\n<!-- release-matrix:start -->\n<!-- release-matrix:end -->\nafter\n")
    outcomes = {"0.19.2": {"002-a": "known failure", "003-a": "unsupported", "004-b": "pass"}}
    outcomes["0.19.8"] = {"002-a": "pass", "003-a": "unsupported", "004-b": "pass"}
    for v, out in outcomes.items():
        (reports / f"deepspeed-{v}.json").write_text(json.dumps(_report(v, out)))
        (reports / f"deepspeed-{v}.status.json").write_text(
            json.dumps(dict(exit="0", expectations=f"deepspeed-{v}.toml", seconds="7"))
        )
    render.main(["0.19.2", "0.19.8", "--reports", str(reports), *page_args(page, details)])
    first_page, first_details = page.read_text(), details.read_text()

    # Elsewhere: no reports at all, the same releases plus one never run.  The two keep what they had.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    render.main(["0.14.5", "0.19.2", "0.19.8", "--reports", str(elsewhere), *page_args(page, details)])
    text = page.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| contract"))
    assert "**0.14.5**<br>not run: no report yet (`bash scripts/release-matrix.sh 0.14.5` runs it)" in header
    assert header.index("0.14.5") < header.index("0.19.2")
    row = next(line for line in text.splitlines() if line.startswith("| `002-a`"))
    assert row == (
        "| `002-a` statement of 002-a | — | [FAIL](../release-matrix.md#ds-0-19-2-002-a) | pass | 0.19.8: FAIL → pass |"
    )
    assert "| **green with its expectations file** | — | yes (7 s) | yes (7 s) |  |" in text
    messages = details.read_text()
    assert "## deepspeed 0.14.5\n\nNot run: no report yet" in messages
    assert messages.split("## deepspeed 0.19.2", 1)[1] == first_details.split("## deepspeed 0.19.2", 1)[1]

    # Without the new release, the pages are as the reports made them: keeping is exact.
    render.main(["0.19.2", "0.19.8", "--reports", str(elsewhere), *page_args(page, details)])
    assert page.read_text() == first_page and details.read_text() == first_details

    # A release run here again replaces its kept column.
    (reports / "deepspeed-0.19.8.json").write_text(
        json.dumps(_report("0.19.8", {"002-a": "FAIL", "003-a": "unsupported", "004-b": "pass"}))
    )
    (reports / "deepspeed-0.19.2.status.json").unlink()
    render.main(["0.19.2", "0.19.8", "--reports", str(reports), *page_args(page, details)])
    row = next(line for line in page.read_text().splitlines() if line.startswith("| `002-a`"))
    assert "[FAIL](../release-matrix.md#ds-0-19-8-002-a)" in row and row.endswith("| same in every release |")


def test_messages_carry_no_machine_paths(render):
    """Why: the manual speaks of the project only; a traceback's venv or cache path is the machine's."""
    text = (
        "ImportError: cannot import name 'x' (/home/ci/.cache/pytest-zero3/ds-wheels/venvs/deepspeed-0.14.5/lib/"
        'python3.11/site-packages/deepspeed/utils/__init__.py)\n  File "/usr/lib/python3/dist-packages/torch/a.py"'
    )
    shown = render.clip(text)
    assert "/home/" not in shown and "/usr/" not in shown and "venvs" not in shown, shown
    assert ".../site-packages/deepspeed/utils/__init__.py" in shown and ".../dist-packages/torch/a.py" in shown


def test_the_fw_family_has_its_own_table_and_messages(render, tmp_path):
    """Why: the opt-in fw family runs apart from the suite (its own reports, deepspeed-X.Y.Z-fw.*); its
    table must fill only its own markers, leave the suite's table as it is, and link to its own page."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "deepspeed-0.19.8-fw.json").write_text(json.dumps(_v3("0.19.8", {"fw-a": "pass", "fw-b": "FAIL"})))
    (reports / "deepspeed-0.19.8-fw.status.json").write_text(json.dumps(dict(exit="1", expectations="x.toml")))
    (reports / "deepspeed-0.14.5-fw.status.json").write_text(json.dumps(dict(error="the sdist does not build")))
    suite = "<!-- release-matrix:start -->\nthe suite's table\n<!-- release-matrix:end -->\n"
    page, _ = _pages(tmp_path, suite + "<!-- release-matrix-fw:start -->\n<!-- release-matrix-fw:end -->\n")
    details = tmp_path / "docs" / "release-matrix-fw.md"
    render.main(["0.14.5", "0.19.8", "--family", "fw", "--reports", str(reports), *page_args(page, details)])
    text = page.read_text()
    assert text.startswith(suite)
    row = next(line for line in text.splitlines() if line.startswith("| `fw-b`"))
    assert "| — | [FAIL](../release-matrix-fw.md#ds-0-19-8-fw-b) |" in row
    assert "0.14.5**<br>not run: the sdist does not build" in text
    messages = details.read_text()
    assert messages.startswith("# The release matrix of the fw family") and '<a id="ds-0-19-8-fw-b"></a>' in messages
