"""Render the release matrix (contracts x DeepSpeed releases) from the suite's JSON reports.

Used by ``scripts/release-matrix.sh``; reads ``deepspeed-X.Y.Z.json`` (the report, schema
``pytest-zero3/report``: versions 3 and 4 are validated against ``pytest_zero3/report.schema.json``;
versions 1 and 2 are read as they are, version 1 with the later outcome words) and ``deepspeed-X.Y.Z.status.json`` (torch used, exit status, or why
the release could not run) from ``--reports``. Writes the table into the manual's release-matrix page
(``--page``, ``docs/results/release-matrix.md``) between the ``release-matrix`` markers, and the failure
messages into ``--details`` (``docs/release-matrix.md``), so that every FAIL in the table is one click
from its message. A release with no status file here (the script never ran it on this machine) keeps
the column and the messages the pages already have, so a run of some releases elsewhere leaves the
others as last measured; one with neither is a column saying it was not run. Every release given is a
column. Generated, never hand-edited: re-run the script.

``--family fw``: the same for an opt-in family's own runs (``deepspeed-X.Y.Z-fw.json`` and its status),
in a table between the ``release-matrix-fw`` markers and messages on a page of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from packaging.version import Version


def markers(family: str = "") -> tuple[str, str]:
    """The lines between which the page holds the table (of ``family``'s runs, or the whole suite's)."""
    name = f"release-matrix-{family}" if family else "release-matrix"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


START, END = markers()
# A known failure is a FAIL of that release (the expectations file only names its reason).
SHOWN = {
    "pass": "pass",
    "fail": "FAIL",
    "known_failure": "FAIL",
    "unexpected_pass": "pass",
    "unsupported": "unsupported",
    "skipped": "skipped",
    "not_run": "not run",
    "world_error": "world error",  # the world did not form: no verdict on the contract
}
#: Shown with a link to the message on the details page.
LINKED = ("FAIL", "unsupported", "world error")
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "pytest_zero3", "report.schema.json")
# Report schema 1 wrote these outcome words; schema 2 writes stable lowercase ones.
V1_WORDS = {"FAIL": "fail", "known failure": "known_failure", "unexpected pass": "unexpected_pass"}


def version_key(v):
    return Version(v)


def load(reports, release, family=""):
    """``(status, report)`` of a release (its ``family`` run's); the status is None when the script never
    ran it here."""
    suffix = f"-{family}" if family else ""

    def read(name):
        try:
            with open(os.path.join(reports, name)) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    status = read(f"deepspeed-{release}{suffix}.status.json")
    if status is None:
        return None, None
    report = None if status.get("error") else read(f"deepspeed-{release}{suffix}.json")
    if report is None and not status.get("error"):
        status["error"] = "no report"
    if report is not None and report.get("version", 1) >= 3:
        problems = validate(report, schema())
        if problems:
            status["error"] = f"report does not match its schema ({problems[0]})"
            report = None
    if report is not None and report.get("version", 1) == 1:
        for c in report["contracts"]:
            c["outcome"] = V1_WORDS.get(c["outcome"], c["outcome"])
        report["summary"] = {V1_WORDS.get(k, k): n for k, n in report["summary"].items()}
    return status, report


def schema():
    """The report's JSON Schema: the one shipped next to the plugin in this checkout, else the installed one's."""
    path = SCHEMA_FILE
    if not os.path.exists(path):
        from pytest_zero3 import report

        path = report.SCHEMA_FILE
    with open(path) as fh:
        return json.load(fh)


def validate(doc, spec) -> list:
    """Where ``doc`` breaks the JSON Schema ``spec`` (empty: it conforms).  jsonschema when installed;
    else a small check of the keywords report.schema.json uses (type, const, enum, required,
    properties, items, additionalProperties, minimum)."""
    try:
        import jsonschema
    except ImportError:
        return _check(doc, spec, "$")
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
        for e in jsonschema.Draft202012Validator(spec).iter_errors(doc)
    ]


_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "null": type(None)}


def _check(value, spec, where) -> list:
    types = spec.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        ok = any(
            isinstance(value, _TYPES[n]) and not (n in ("integer", "number") and isinstance(value, bool)) for n in names
        )
        if not ok:
            return [f"{where}: {value!r} is not of type {types}"]
    if "const" in spec and value != spec["const"]:
        return [f"{where}: {value!r} is not {spec['const']!r}"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"{where}: {value!r} is not one of {spec['enum']}"]
    if "minimum" in spec and isinstance(value, (int, float)) and value < spec["minimum"]:
        return [f"{where}: {value!r} is less than {spec['minimum']}"]
    problems = []
    if isinstance(value, dict):
        problems += [f"{where}: {k!r} is a required property" for k in spec.get("required", ()) if k not in value]
        props = spec.get("properties", {})
        for k, v in value.items():
            sub = props.get(k, spec.get("additionalProperties"))
            if isinstance(sub, dict):
                problems += _check(v, sub, f"{where}/{k}")
    if isinstance(value, list) and isinstance(spec.get("items"), dict):
        for i, v in enumerate(value):
            problems += _check(v, spec["items"], f"{where}/{i}")
    return problems


def anchor(release, cid):
    return f"ds-{release}-{cid}".replace(".", "-")


#: A path up to an installed package's directory: the machine's, not the project's (venvs, caches, home).
MACHINE_PATH = re.compile(r"(?:/[^\s\"'()/]+)+/(site-packages|dist-packages)/")
#: pytest's temporary directory of one run, and any other path under a home directory.
PYTEST_TMP = re.compile(r"/tmp/pytest-of-[^/\s]+/pytest-\d+/")
HOME_PATH = re.compile(r"/(?:root|home/[^/\s]+)/[^\s\"')]*")


def unmachined(text: str) -> str:
    """``text`` with machine paths cut: to the installed package's (``.../site-packages/``), pytest's
    temporary directory as ``$TMP``, anything else under a home directory to ``...``."""
    text = MACHINE_PATH.sub(r".../\1/", text)
    text = PYTEST_TMP.sub("$TMP/", text)
    return HOME_PATH.sub(".../", text)


def clip(text, limit=4000):
    """``text`` for the page: machine paths cut to the installed package's (``.../site-packages/``), at
    most ``limit`` characters."""
    text = unmachined((text or "").strip())
    return text if len(text) <= limit else text[:limit] + " ..."


def not_run(release):
    """Why a release has no column of results: the script has not run it where the pages were made."""
    return f"no report yet (`bash scripts/release-matrix.sh {release}` runs it)"


#: The first lines of a failure-message page, by family ("": the whole suite's).
TITLE = {"": "The release matrix: failure messages", "fw": "The release matrix of the fw family: failure messages"}


def column(release, status, report):
    """One release's column from its report (or, with none, the reason it did not run): the header
    cell, ``{id: (statement, shown)}``, the totals and the gate cells."""
    cell = f"**{release}**"
    if status.get("torch") and status.get("torch") != status.get("default_torch"):
        cell += f"<br>torch {status['torch']} (does not import on {status['default_torch']})"
    if report is None:
        return dict(header=cell + f"<br>not run: {status.get('error') or not_run(release)}", rows=None)
    s = report["summary"]
    ok = str(status.get("exit")) == "0" and status.get("expectations")
    return dict(
        header=cell,
        rows={c["id"]: (c["statement"], SHOWN.get(c["outcome"], c["outcome"])) for c in report["contracts"]},
        totals=f"{s['pass'] + s['unexpected_pass']} / {s['fail'] + s['known_failure']} / {s['unsupported']}",
        gate=f"{'yes' if ok else 'NO'} ({status.get('seconds', '?')} s)",
    )


def _cells(line):
    """A Markdown table row's cells, ``\\|`` inside a cell kept as ``|``."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def page_columns(page, family=""):
    """The columns of results in the table already on the page, ``{release: column}``: what a run that
    has no report of a release (another machine made the last one) keeps, as :func:`column` makes them."""
    start, end = markers(family)
    if start not in page or end not in page:
        return {}
    lines = [line for line in page.split(start, 1)[1].split(end, 1)[0].splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return {}
    header = _cells(lines[0])[1:-1]
    releases = [re.match(r"\*\*([^*]+)\*\*", h) for h in header]
    cols = {m.group(1): dict(header=h, rows={}) for m, h in zip(releases, header) if m and "not run:" not in h}
    for line in lines[2:]:
        cells = _cells(line)
        first, values = cells[0], cells[1 : 1 + len(header)]
        for m, value in zip(releases, values):
            if not m or m.group(1) not in cols:
                continue
            col = cols[m.group(1)]
            if first == "**pass / FAIL / unsupported**":
                col["totals"] = value
            elif first == "**green with its expectations file**":
                col["gate"] = value
            else:
                row = re.match(r"`([^`]+)` (.*)", first)
                shown = re.sub(r"^\[([^\]]+)\]\(.*\)$", r"\1", value)
                if row and shown != "absent":
                    col["rows"][row.group(1)] = (row.group(2), shown)
    return cols


def page_sections(details):
    """``{release: text}``: each release's section of the failure-message page already there."""
    parts = re.split(r"^(?=## deepspeed )", details, flags=re.M)[1:]
    return {p.split("\n", 1)[0].removeprefix("## deepspeed ").strip(): p.rstrip("\n") + "\n" for p in parts}


def contract_rows(columns):
    """``{id: statement}`` of every contract in any column, a report's statement before a kept one's."""
    rows = {}
    for col in sorted(columns.values(), key=lambda c: "kept" in c):
        for cid, (statement, _shown) in (col["rows"] or {}).items():
            rows.setdefault(cid, statement)
    return dict(sorted(rows.items()))


def changes(releases, columns, cid):
    """'0.19.3: FAIL → pass' for every release whose outcome differs from the previous one's."""
    out, prev = [], None
    for v in releases:
        rows = columns[v]["rows"]
        if rows is None:
            continue
        shown = rows[cid][1] if cid in rows else "absent"
        if prev is not None and shown != prev:
            out.append(f"{v}: {prev} → {shown}")
        prev = shown
    return out


def render(releases, columns, link_base):
    head = ["contract", *(columns[v]["header"] for v in releases), "first change (in release order)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cid, statement in contract_rows(columns).items():
        cells = [f"`{cid}` {statement}"]
        for v in releases:
            rows = columns[v]["rows"]
            shown = "—" if rows is None else rows[cid][1] if cid in rows else "absent"
            if shown in LINKED:
                shown = f"[{shown}]({link_base}#{anchor(v, cid)})"
            cells.append(shown)
        ch = changes(releases, columns, cid)
        cells.append(ch[0] if ch else "same in every release")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for label, key in (("**pass / FAIL / unsupported**", "totals"), ("**green with its expectations file**", "gate")):
        cells = [label, *(columns[v].get(key, "—") if columns[v]["rows"] is not None else "—" for v in releases), ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def details(releases, reports, statuses, kept=None, family=""):
    """The failure-message page; a release with neither a report nor a status keeps its section from
    ``kept`` (the page as it was), else says it was not run."""
    kept = kept or {}
    out = [
        f"# {TITLE[family]}",
        "",
        "Generated by `scripts/release-matrix.sh` (do not edit). For each release and contract that is",
        "not a pass: the reason from the release's expectations file, if any, and the first failing",
        "rank's message (or the unsupported reason).",
        "",
    ]
    for v in releases:
        st = statuses[v]
        if st is None and v in kept:
            out += [kept[v].rstrip("\n"), ""]
            continue
        out.append(f"## deepspeed {v}")
        out.append("")
        if v not in reports:
            out += [f"Not run: {(st or {}).get('error') or not_run(v)}", ""]
            continue
        imp = reports[v]["implementation"]
        out += [
            f"deepspeed {imp.get('deepspeed')}, torch {imp.get('torch')}, {imp.get('backend')}, "
            f"{imp.get('world_size')} ranks; expectations: `{st.get('expectations') or 'none'}`.",
            "",
        ]
        for c in reports[v]["contracts"]:
            shown = SHOWN.get(c["outcome"], c["outcome"])
            if shown not in LINKED:
                continue
            out.append(f'<a id="{anchor(v, c["id"])}"></a>**{v} · `{c["id"]}` {shown}**: {c["statement"]}')
            out.append("")
            if c["outcome"] == "known_failure":
                pinned = f" (expected cause: it {c['expected_cause']})" if c.get("expected_cause") else ""
                out += [f"Known failure: {c['reason']}{pinned}", ""]
                msg = c.get("message", "")
            elif c["outcome"] == "unsupported":
                msg = c.get("reason", "")
            else:
                msg = c.get("message") or c.get("reason", "")
            if msg:
                out += ["```", clip(msg), "```", ""]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("releases", nargs="+")
    ap.add_argument("--reports", required=True)
    ap.add_argument("--page", required=True, help="the Markdown page whose release-matrix markers get the table")
    ap.add_argument("--details", required=True, help="the Markdown page the failure messages are written to")
    ap.add_argument("--family", default="", choices=sorted(TITLE), help="an opt-in family's runs (fw), not the suite's")
    args = ap.parse_args(argv)
    start, end = markers(args.family)
    releases = sorted(set(args.releases), key=version_key)
    with open(args.page) as fh:
        page = fh.read()
    if start not in page or end not in page:
        raise SystemExit(f"{args.page}: add the lines {start} and {end} where the matrix goes.")
    try:
        with open(args.details) as fh:
            old_details = fh.read()
    except OSError:
        old_details = ""
    # A release the script never ran here (no status file) keeps the column and the messages the pages
    # already have; one it ran shows this run's outcome, or why it could not run.
    kept_columns, kept_sections = page_columns(page, args.family), page_sections(old_details)
    statuses, reports, columns = {}, {}, {}
    for v in releases:
        statuses[v], rep = load(args.reports, v, args.family)
        if rep is not None:
            reports[v] = rep
        if statuses[v] is None and v in kept_columns and v in kept_sections:
            columns[v] = dict(kept_columns[v], kept=True)
        else:
            columns[v] = column(v, statuses[v] or {"error": not_run(v)}, rep)
    link = os.path.relpath(os.path.abspath(args.details), os.path.dirname(os.path.abspath(args.page)))
    table = render(releases, columns, link.replace(os.sep, "/"))
    pre, rest = page.split(start, 1)
    _, post = rest.split(end, 1)
    with open(args.page, "w") as fh:
        fh.write(pre + start + "\n" + "\n".join(table) + "\n" + end + post)
    os.makedirs(os.path.dirname(os.path.abspath(args.details)), exist_ok=True)
    kept = [v for v in releases if columns[v].get("kept")]
    with open(args.details, "w") as fh:
        text = "\n".join(details(releases, reports, statuses, {v: kept_sections[v] for v in kept}, args.family)) + "\n"
        fh.write(unmachined(text))  # kept sections too: they may predate the cut
    print(
        f"matrix of {len(releases)} releases written to {args.page} and {args.details}"
        + (f" ({', '.join(kept)} kept from the pages: no report here)" if kept else "")
    )


if __name__ == "__main__":
    main()
