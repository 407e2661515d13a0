"""The conformance report: one row per contract ID, in the terminal, as JSON and as Markdown.

Rows are built from test reports (``pytest_runtest_logreport``), so the table is right under
``pytest -n`` too: workers attach a small JSON-able ``zero3`` dict to each contract test's report,
and whichever process prints the summary aggregates them.

JSON schema (``schema: "pytest-zero3/report"``, ``version: 1``)::

    {"schema": "pytest-zero3/report", "version": 1,
     "implementation": {"spec", "impl", "deepspeed", "deepspeed_path", "coordinator", "torch",
                        "backend", "world_size"},
     "summary": {"pass": n, "FAIL": n, "unsupported": n, "known failure": n, "unexpected pass": n,
                 "skipped": n, "total": n},
     "contracts": [{"id", "family", "statement", "outcome", "reason", "message", "duration", "tests": [nodeid],
                    "ranks": [{"rank", "status", "message", "traceback"}]}]}

``reason`` is the expectation's reason for a known failure; ``message`` is the failure itself
(FAIL and known failure), so a report made with an expectations file still shows what failed.
"""
from __future__ import annotations

import json
import warnings

import pytest

from pytest_zero3 import expectations, impl, launcher, markers
from pytest_zero3.scenario import Unsupported

PASS, FAIL, UNSUPPORTED, KNOWN, XPASS, SKIP = "pass", "FAIL", "unsupported", "known failure", "unexpected pass", "skipped"
# Worst first: a contract row shows its worst test.  A listed contract is an unexpected pass only if
# none of its tests failed (one parametrisation may pass where another still fails).
ORDER = (FAIL, KNOWN, XPASS, UNSUPPORTED, SKIP, PASS)
SCHEMA, SCHEMA_VERSION = "pytest-zero3/report", 1

_STATE = pytest.StashKey()
_OUTCOMES = pytest.StashKey()


class _State:
    def __init__(self, config, settings):
        self.config, self.settings = config, settings
        self.expected = expectations.load(config.getoption("--zero3-expect"))
        self.strict = config.getoption("--zero3-strict")
        self.rows = {}  # contract id -> row dict
        self.identity = {}


_CONFIG = None  # pytest_runtest_logreport receives no config; the session's config is kept here


def configure(config, settings) -> None:
    global _CONFIG
    config.stash[_STATE] = _State(config, settings)
    _CONFIG = config


def header_lines(settings) -> list:
    info = impl.describe_without_import(settings.spec)
    lines = [f"zero3: impl={info['spec']} ({info['impl']})",
             f"zero3: deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path', '?')}, torch {info['torch']}",
             f"zero3: backend={settings.backend}, world size={settings.world_size}, timeout={settings.timeout:g}s"]
    if settings.spec.kind == "class":
        lines.append(f"zero3: coordinator={settings.spec.module}:{settings.spec.cls_name}")
    return lines


def recorder(item):
    """Callback given to worlds: keeps each run's per-rank outcomes on the test item."""
    def record(outcomes):
        item.stash.setdefault(_OUTCOMES, []).append(outcomes)
    return record


def check_expectations(config, items) -> None:
    state = config.stash[_STATE]
    known = {c[0] for c in map(markers.contract, items) if c}
    for cid in sorted(set(state.expected) - known):
        warnings.warn(pytest.PytestWarning(f"--zero3-expect lists {cid!r}, which matches no collected contract."))
    for item in items:
        c = markers.contract(item)
        if c:
            item.user_properties.append(("zero3_contract", c[0]))


def on_report(item, call, rep) -> None:
    """Show world failures as their per-rank text; classify contract tests' results."""
    from pytest_zero3.outcome import first_failure
    from pytest_zero3.world import WorldFailure
    if rep.failed and call.excinfo is not None and call.excinfo.errisinstance(WorldFailure):
        rep.longrepr = str(call.excinfo.value)
    c = markers.contract(item)
    if c is None or not (rep.when == "call" or (rep.when == "setup" and not rep.passed)):
        return
    state = item.config.stash[_STATE]
    cid, statement = c
    reason = message = ""
    if rep.failed and call.excinfo is not None:  # the failure itself, kept for a known failure too
        if call.excinfo.errisinstance(WorldFailure):
            message = first_failure(call.excinfo.value.outcomes)
        else:
            message = call.excinfo.exconly()[:4000]  # an assertion's detail lines are the evidence
    if call.excinfo is not None and call.excinfo.errisinstance(Unsupported):
        status, reason = UNSUPPORTED, str(call.excinfo.value)
        rep.outcome, rep.longrepr = "skipped", (str(item.path), item.location[1] or 0, f"unsupported: {reason}")
    elif rep.skipped and not hasattr(rep, "wasxfail"):
        status, reason = SKIP, rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    elif rep.failed and cid in state.expected:
        status, reason = KNOWN, state.expected[cid]
        rep.outcome, rep.wasxfail = "skipped", f"known failure {cid}: {reason}"
    elif rep.failed:
        status, reason = FAIL, (message.splitlines() or [""])[0]
    elif cid in state.expected:
        status, reason = XPASS, f"listed in --zero3-expect: {state.expected[cid]}"  # judged per contract at the end
    else:
        status = PASS
    ranks = []
    for outcomes in item.stash.get(_OUTCOMES, []):
        ranks = [dict(rank=o.rank, status=o.status, message=o.message, traceback=o.traceback) for o in outcomes]
        if any(o.status != "passed" for o in outcomes):
            break
    identity = next((o.identity for outs in item.stash.get(_OUTCOMES, []) for o in outs if o.identity), {})
    rep.zero3 = dict(id=cid, statement=statement, status=status, reason=reason,
                     message=message if status in (FAIL, KNOWN) else "",
                     ranks=ranks if status in (FAIL, KNOWN) else [], identity=identity)


def teststatus(rep):
    data = getattr(rep, "zero3", None)
    if data and data["status"] == UNSUPPORTED and rep.when == "call":
        return "skipped", "u", "UNSUPPORTED"
    return None


def logreport(rep) -> None:
    data = getattr(rep, "zero3", None)
    if not data or _CONFIG is None:
        return
    state = _CONFIG.stash[_STATE]
    if data.get("identity") and not state.identity:
        state.identity = data["identity"]
    row = state.rows.setdefault(data["id"], dict(id=data["id"], family=data["id"].split("-")[0],
                                                 statement=data["statement"], outcome=PASS, reason="", message="",
                                                 duration=0.0, tests=[], ranks=[]))
    row["duration"] += rep.duration
    row["tests"].append(rep.nodeid)
    if ORDER.index(data["status"]) < ORDER.index(row["outcome"]) or len(row["tests"]) == 1:
        row.update(outcome=data["status"], reason=data["reason"], message=data.get("message", ""), ranks=data["ranks"])


def _implementation(state) -> dict:
    info = impl.describe_without_import(state.settings.spec)
    info.update(backend=state.settings.resolved_backend or state.settings.backend,
                world_size=state.settings.world_size)
    info.update(state.identity)  # what the ranks actually ran wins over what was predicted
    return info


def _summary(rows) -> dict:
    counts = {k: 0 for k in (PASS, FAIL, UNSUPPORTED, KNOWN, XPASS, SKIP)}
    for row in rows:
        counts[row["outcome"]] += 1
    counts["total"] = len(rows)
    return counts


def terminal_summary(tr, config) -> None:
    state = config.stash[_STATE]
    if not state.rows or (launcher.active() and launcher.rank() != 0):
        return
    rows = sorted(state.rows.values(), key=lambda r: r["id"])
    info = _implementation(state)
    tr.write_sep("=", "ZeRO-3 conformance")
    tr.write_line(f"implementation: {info['spec']} ({info['impl']})")
    tr.write_line(f"deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path')}")
    tr.write_line(f"coordinator: {info.get('coordinator', '?')}; torch {info.get('torch')}; "
                  f"backend {info['backend']}; world size {info['world_size']}")
    tr.write_line("")
    width = max(len(r["statement"]) for r in rows)
    width = min(width, 70)
    for row in rows:
        text = row["statement"] if len(row["statement"]) <= width else row["statement"][:width - 1] + "…"
        mark = {FAIL: {"red": True, "bold": True}, XPASS: {"yellow": True}, KNOWN: {"yellow": True},
                UNSUPPORTED: {"cyan": True}, PASS: {"green": True}}.get(row["outcome"], {})
        tr.write(f"  {row['id']:<7} {text:<{width}}  ")
        tr.write(f"{row['outcome']}", **mark)
        tr.write_line(f"  ({row['reason']})" if row["reason"] and row["outcome"] != PASS else "")
    counts = _summary(rows)
    tr.write_line("")
    if state.strict:
        for cid in _unexpected_passes(state):
            tr.write_line(f"--zero3-strict: contract {cid} passed but --zero3-expect lists it as failing: "
                          "remove it from the expectations file.", red=True, bold=True)
    tr.write_line("contracts: " + ", ".join(f"{counts[k]} {k}" for k in (PASS, FAIL, KNOWN, XPASS, UNSUPPORTED, SKIP)
                                              if counts[k]) + f" (of {counts['total']} checked)")


def _unexpected_passes(state) -> list:
    return sorted(cid for cid, row in state.rows.items() if row["outcome"] == XPASS)


def session_finish(session) -> None:
    config = session.config
    state = config.stash[_STATE]
    if hasattr(config, "workerinput"):
        return
    if state.strict and _unexpected_passes(state) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if launcher.active() and launcher.rank() != 0:
        return
    rows = sorted(state.rows.values(), key=lambda r: r["id"])
    doc = dict(schema=SCHEMA, version=SCHEMA_VERSION, implementation=_implementation(state),
               summary=_summary(rows), contracts=rows)
    path = config.getoption("--zero3-report")
    if path:
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=2)
    md = config.getoption("--zero3-report-md")
    if md:
        with open(md, "w") as fh:
            fh.write(markdown(doc))


def markdown(doc: dict) -> str:
    info = doc["implementation"]
    lines = ["## ZeRO-3 conformance", "",
             f"Implementation `{info['spec']}` ({info['impl']}); deepspeed {info.get('deepspeed')} "
             f"from `{info.get('deepspeed_path')}`; coordinator `{info.get('coordinator', '?')}`; "
             f"torch {info.get('torch')}; {info['backend']}, {info['world_size']} ranks.", "",
             "| contract | statement | result | reason |", "|---|---|---|---|"]
    for row in doc["contracts"]:
        reason = row["reason"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['id']} | {row['statement']} | **{row['outcome']}** | {reason} |")
    s = doc["summary"]
    lines += ["", ", ".join(f"{s[k]} {k}" for k in (PASS, FAIL, KNOWN, XPASS, UNSUPPORTED, SKIP) if s[k])
              + f" (of {s['total']} contracts)", ""]
    return "\n".join(lines)
