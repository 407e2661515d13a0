"""Render the release matrix (contracts x DeepSpeed releases) from the suite's JSON reports.

Used by ``scripts/release-matrix.sh``; reads ``deepspeed-X.Y.Z.json`` (the report, schema
``pytest-zero3/report``: versions 3 and 4 are validated against ``pytest_zero3/report.schema.json``;
versions 1 and 2 are read as they are, version 1 with the later outcome words) and ``deepspeed-X.Y.Z.status.json`` (torch used, exit status, or why
the release could not run) from ``--reports``. Writes the table into the manual's release-matrix page
(``--page``, ``docs/results/release-matrix.md``) between the ``release-matrix`` markers, and the failure
messages into ``--details`` (``docs/release-matrix.md``), so that every FAIL in the table is one click
from its message. Generated, never hand-edited: re-run the script.
"""

from __future__ import annotations

import argparse
import json
import os

from packaging.version import Version

START, END = "<!-- release-matrix:start -->", "<!-- release-matrix:end -->"
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


def load(reports, release):
    def read(name):
        try:
            with open(os.path.join(reports, name)) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    status = read(f"deepspeed-{release}.status.json") or {"error": "not run"}
    report = None if status.get("error") else read(f"deepspeed-{release}.json")
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


def clip(text, limit=1500):
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def contract_rows(reports):
    rows = {}
    for report in reports.values():
        for c in report["contracts"]:
            rows.setdefault(c["id"], c["statement"])
    return dict(sorted(rows.items()))


def changes(releases, reports, cid):
    """'0.19.3: FAIL → pass' for every release whose outcome differs from the previous one's."""
    out, prev = [], None
    for v in releases:
        if v not in reports:
            continue
        row = next((c for c in reports[v]["contracts"] if c["id"] == cid), None)
        shown = SHOWN.get(row["outcome"], row["outcome"]) if row else "absent"
        if prev is not None and shown != prev:
            out.append(f"{v}: {prev} → {shown}")
        prev = shown
    return out


def render(releases, reports, statuses, link_base):
    lines = []
    head = ["contract"]
    for v in releases:
        st = statuses[v]
        cell = f"**{v}**"
        if st.get("torch") and st.get("torch") != st.get("default_torch"):
            cell += f"<br>torch {st['torch']} (does not import on {st['default_torch']})"
        if st.get("error"):
            cell += f"<br>not run: {st['error']}"
        head.append(cell)
    head.append("first change (in release order)")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for cid, statement in contract_rows(reports).items():
        cells = [f"`{cid}` {statement}"]
        for v in releases:
            if v not in reports:
                cells.append("—")
                continue
            row = next((c for c in reports[v]["contracts"] if c["id"] == cid), None)
            if row is None:
                cells.append("absent")
                continue
            shown = SHOWN.get(row["outcome"], row["outcome"])
            if shown in LINKED:
                shown = f"[{shown}]({link_base}#{anchor(v, cid)})"
            cells.append(shown)
        ch = changes(releases, reports, cid)
        cells.append(ch[0] if ch else "same in every release")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    totals = ["**pass / FAIL / unsupported**"]
    for v in releases:
        if v not in reports:
            totals.append("—")
            continue
        s = reports[v]["summary"]
        totals.append(f"{s['pass'] + s['unexpected_pass']} / {s['fail'] + s['known_failure']} / {s['unsupported']}")
    totals.append("")
    lines.append("| " + " | ".join(totals) + " |")
    gate = ["**green with its expectations file**"]
    for v in releases:
        st = statuses[v]
        if v not in reports:
            gate.append("—")
        else:
            ok = str(st.get("exit")) == "0" and st.get("expectations")
            gate.append(f"{'yes' if ok else 'NO'} ({st.get('seconds', '?')} s)")
    gate.append("")
    lines.append("| " + " | ".join(gate) + " |")
    return lines


def details(releases, reports, statuses):
    out = [
        "# The release matrix: failure messages",
        "",
        "Generated by `scripts/release-matrix.sh` (do not edit). For each release and contract that is",
        "not a pass: the reason from the release's expectations file, if any, and the first failing",
        "rank's message (or the unsupported reason).",
        "",
    ]
    for v in releases:
        st = statuses[v]
        out.append(f"## deepspeed {v}")
        out.append("")
        if v not in reports:
            out += [f"Not run: {st.get('error')}", ""]
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
    args = ap.parse_args(argv)
    releases = sorted(args.releases, key=version_key)
    statuses, reports = {}, {}
    for v in releases:
        statuses[v], rep = load(args.reports, v)
        if rep is not None:
            reports[v] = rep
    link = os.path.relpath(os.path.abspath(args.details), os.path.dirname(os.path.abspath(args.page)))
    table = render(releases, reports, statuses, link.replace(os.sep, "/"))
    with open(args.page) as fh:
        page = fh.read()
    if START not in page or END not in page:
        raise SystemExit(f"{args.page}: add the lines {START} and {END} where the matrix goes.")
    pre, rest = page.split(START, 1)
    _, post = rest.split(END, 1)
    with open(args.page, "w") as fh:
        fh.write(pre + START + "\n" + "\n".join(table) + "\n" + END + post)
    os.makedirs(os.path.dirname(os.path.abspath(args.details)), exist_ok=True)
    with open(args.details, "w") as fh:
        fh.write("\n".join(details(releases, reports, statuses)) + "\n")
    print(f"matrix of {len(releases)} releases written to {args.page} and {args.details}")


if __name__ == "__main__":
    main()
