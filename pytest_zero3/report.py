"""The conformance report: one row per contract ID, in the terminal, as JSON and as Markdown.

Rows are built from test reports (``pytest_runtest_logreport``), so the table is right under
``pytest -n`` too: workers attach a small JSON-able ``zero3`` dict to each contract test's report,
and whichever process prints the summary aggregates them.  Registered contracts (see
:mod:`pytest_zero3.registry`) that were selected but did not run get a ``not_run`` row.

JSON schema (``schema: "pytest-zero3/report"``, ``version: 2``)::

    {"schema": "pytest-zero3/report", "version": 2,
     "implementation": {"spec", "impl", "deepspeed", "deepspeed_path", "coordinator", "torch",
                        "backend", "world_size"},
     "summary": {"pass": n, "fail": n, "known_failure": n, "unexpected_pass": n, "unsupported": n,
                 "skipped": n, "not_run": n, "total": n},
     "contracts": [{"id", "family", "statement", "source", "outcome", "reason", "message", "duration",
                    "tests": [nodeid], "ranks": [{"rank", "status", "message", "traceback"}]}]}

``reason`` is the expectation's reason for a known failure; ``message`` is the failure itself (fail
and known_failure), so a report made with an expectations file still shows what failed.

``outcome`` is one of the :class:`~pytest_zero3.outcome.Outcome` values (stable lowercase words);
version 1 used "FAIL", "known failure" and "unexpected pass" and had no "not_run" or "source".
"""

from __future__ import annotations

import json
import warnings

import pytest

from pytest_zero3 import expectations, impl, launcher, markers, registry
from pytest_zero3.outcome import SEVERITY, Outcome

SCHEMA, SCHEMA_VERSION = "pytest-zero3/report", 2
#: The terminal's and the summary's order.
SHOWN = (
    Outcome.PASS,
    Outcome.FAIL,
    Outcome.KNOWN_FAILURE,
    Outcome.UNEXPECTED_PASS,
    Outcome.UNSUPPORTED,
    Outcome.SKIPPED,
    Outcome.NOT_RUN,
)
_COLOURS = {
    Outcome.FAIL: {"red": True, "bold": True},
    Outcome.UNEXPECTED_PASS: {"yellow": True},
    Outcome.KNOWN_FAILURE: {"yellow": True},
    Outcome.UNSUPPORTED: {"cyan": True},
    Outcome.PASS: {"green": True},
    Outcome.NOT_RUN: {"yellow": True},
}

_OUTCOMES = pytest.StashKey()


class Report:
    """The rows of one session, and what prints and writes them."""

    def __init__(self, config, settings):
        self.config, self.settings = config, settings
        self.expected = expectations.load(settings.expect)
        self.strict = settings.strict
        self.rows = {}  # contract id -> row dict
        self.identity = {}

    def header_lines(self) -> list:
        settings = self.settings
        info = impl.describe_without_import(settings.spec)
        lines = [
            f"zero3: impl={info['spec']} ({info['impl']})",
            f"zero3: deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path', '?')}, torch {info['torch']}",
            f"zero3: backend={settings.backend}, world size={settings.world_size}, timeout={settings.timeout:g}s",
        ]
        if settings.spec.kind == "class":
            lines.append(f"zero3: coordinator={settings.spec.module}:{settings.spec.cls_name}")
        lines += [f"zero3: warning: {w}" for w in [impl.base_warning(settings.spec)] if w]
        return lines

    def check_expectations(self, items) -> None:
        # a registered contract that was deselected (-k, --zero3-select) is no mistake; an unknown ID is
        known = {c[0] for c in map(markers.contract, items) if c} | set(registry.load())
        for cid in sorted(set(self.expected) - known):
            warnings.warn(
                pytest.PytestWarning(
                    f"--zero3-expect lists {cid!r}, which is no registered contract and matches no collected one: "
                    "remove it from the expectations file, or fix its ID."
                ),
                stacklevel=1,
            )
        for item in items:
            c = markers.contract(item)
            if c:
                item.user_properties.append(("zero3_contract", c[0]))

    def on_report(self, item, call, rep) -> None:
        """Show world failures as their per-rank text; classify contract tests' results."""
        from pytest_zero3.outcome import first_failure
        from pytest_zero3.scenario import Unsupported
        from pytest_zero3.world import WorldFailure

        if rep.failed and call.excinfo is not None and call.excinfo.errisinstance(WorldFailure):
            rep.longrepr = str(call.excinfo.value)
        c = markers.contract(item)
        if c is None or not (rep.when == "call" or (rep.when == "setup" and not rep.passed)):
            return
        cid, statement = c
        reason = message = ""
        if rep.failed and call.excinfo is not None:  # the failure itself, kept for a known failure too
            if call.excinfo.errisinstance(WorldFailure):
                message = first_failure(call.excinfo.value.outcomes)
            else:
                message = call.excinfo.exconly()[:4000]  # an assertion's detail lines are the evidence
        if call.excinfo is not None and call.excinfo.errisinstance(Unsupported):
            status, reason = Outcome.UNSUPPORTED, str(call.excinfo.value)
            rep.outcome, rep.longrepr = "skipped", (str(item.path), item.location[1] or 0, f"unsupported: {reason}")
        elif rep.skipped and not hasattr(rep, "wasxfail"):
            status, reason = Outcome.SKIPPED, rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        elif rep.failed and cid in self.expected:
            status, reason = Outcome.KNOWN_FAILURE, self.expected[cid]
            rep.outcome, rep.wasxfail = "skipped", f"known failure {cid}: {reason}"
        elif rep.failed:
            status, reason = Outcome.FAIL, (message.splitlines() or [""])[0]
        elif cid in self.expected:  # judged per contract at the end
            status, reason = Outcome.UNEXPECTED_PASS, f"listed in --zero3-expect: {self.expected[cid]}"
        else:
            status = Outcome.PASS
        ranks = []
        for outcomes in item.stash.get(_OUTCOMES, []):
            ranks = [dict(rank=o.rank, status=o.status, message=o.message, traceback=o.traceback) for o in outcomes]
            if any(o.status != "passed" for o in outcomes):
                break
        identity = next((o.identity for outs in item.stash.get(_OUTCOMES, []) for o in outs if o.identity), {})
        failed = status in (Outcome.FAIL, Outcome.KNOWN_FAILURE)
        rep.zero3 = dict(
            id=cid,
            statement=statement,
            status=status.value,
            reason=reason,
            message=message if failed else "",
            ranks=ranks if failed else [],
            identity=identity,
        )

    def add(self, rep) -> None:
        """Fold one test report (from this process or an xdist worker) into its contract's row."""
        data = getattr(rep, "zero3", None)
        if not data:
            return
        if data.get("identity") and not self.identity:
            self.identity = data["identity"]
        status = Outcome(data["status"])
        row = self.rows.setdefault(data["id"], _row(data["id"], data["statement"]))
        row["duration"] += rep.duration
        row["tests"].append(rep.nodeid)
        if SEVERITY.index(status) < SEVERITY.index(Outcome(row["outcome"])) or len(row["tests"]) == 1:
            row.update(outcome=status.value, reason=data["reason"], message=data["message"], ranks=data["ranks"])

    def all_rows(self) -> list:
        """The rows in ID order, with a ``not_run`` row for each registered, selected contract that
        has none (only when registered contracts ran: a run of one's own contracts lists only those)."""
        rows = dict(self.rows)
        known = registry.load()
        if any(cid in known for cid in rows):
            prefixes = markers.select_prefixes(self.config)
            for cid, contract in known.items():
                if cid not in rows and markers.selected(cid, prefixes):
                    rows[cid] = _row(
                        cid,
                        contract.statement,
                        outcome=Outcome.NOT_RUN.value,
                        reason="no test of it ran (deselected, or the run stopped early)",
                    )
        return [rows[cid] for cid in sorted(rows)]

    def implementation(self) -> dict:
        info = impl.describe_without_import(self.settings.spec)
        info.update(
            backend=self.settings.resolved_backend or self.settings.backend, world_size=self.settings.world_size
        )
        info.update(self.identity)  # what the ranks actually ran wins over what was predicted
        return info

    def terminal_summary(self, tr) -> None:
        if not self.rows or (launcher.active() and launcher.rank() != 0):
            return
        rows = self.all_rows()
        info = self.implementation()
        tr.write_sep("=", "ZeRO-3 conformance")
        tr.write_line(f"implementation: {info['spec']} ({info['impl']})")
        tr.write_line(f"deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path')}")
        tr.write_line(
            f"coordinator: {info.get('coordinator', '?')}; torch {info.get('torch')}; "
            f"backend {info['backend']}; world size {info['world_size']}"
        )
        tr.write_line("")
        width = min(max(len(r["statement"]) for r in rows), 70)
        not_run = [r for r in rows if r["outcome"] == Outcome.NOT_RUN.value]
        shown = rows
        if len(not_run) > NOT_RUN_ROWS:  # a -k or --zero3-select run: one line, not a screenful
            shown = [r for r in rows if r["outcome"] != Outcome.NOT_RUN.value]
        for row in shown:
            text = row["statement"] if len(row["statement"]) <= width else row["statement"][: width - 1] + "…"
            outcome = Outcome(row["outcome"])
            tr.write(f"  {row['id']:<7} {text:<{width}}  ")
            tr.write(outcome.label, **_COLOURS.get(outcome, {}))
            tr.write_line(f"  ({row['reason']})" if row["reason"] and outcome != Outcome.PASS else "")
        if len(not_run) > NOT_RUN_ROWS:
            tr.write("  " + " ".join(r["id"] for r in not_run) + "  ")
            tr.write(Outcome.NOT_RUN.label, **_COLOURS[Outcome.NOT_RUN])
            tr.write_line(f"  ({not_run[0]['reason']})")
        counts = summary(rows)
        tr.write_line("")
        if self.strict:
            for cid in self.unexpected_passes():
                tr.write_line(
                    f"--zero3-strict: contract {cid} passed but --zero3-expect lists it as failing: "
                    "remove it from the expectations file.",
                    red=True,
                    bold=True,
                )
        tr.write_line(
            "contracts: "
            + ", ".join(f"{counts[k.value]} {k.label}" for k in SHOWN if counts[k.value])
            + f" (of {counts['total']} checked)"
        )

    def unexpected_passes(self) -> list:
        return sorted(cid for cid, row in self.rows.items() if row["outcome"] == Outcome.UNEXPECTED_PASS.value)

    def session_finish(self, session) -> None:
        config = session.config
        if hasattr(config, "workerinput"):
            return
        if self.strict and self.unexpected_passes() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if launcher.active() and launcher.rank() != 0:
            return
        rows = self.all_rows() if self.rows else []
        doc = dict(
            schema=SCHEMA,
            version=SCHEMA_VERSION,
            implementation=self.implementation(),
            summary=summary(rows),
            contracts=rows,
        )
        path = self.settings.report
        if path:
            with open(path, "w") as fh:
                json.dump(doc, fh, indent=2)
        md = self.settings.report_md
        if md:
            with open(md, "w") as fh:
                fh.write(markdown(doc))


#: Up to this many not-run contracts get a row each in the terminal summary; more share one line.
NOT_RUN_ROWS = 3


def _row(cid: str, statement: str, outcome: str = Outcome.PASS.value, reason: str = "") -> dict:
    known = registry.load().get(cid)
    return dict(
        id=cid,
        family=registry.family(cid),
        statement=statement,
        source=known.source if known else "",
        outcome=outcome,
        reason=reason,
        message="",
        duration=0.0,
        tests=[],
        ranks=[],
    )


def recorder(item):
    """Callback given to worlds: keeps each run's per-rank outcomes on the test item."""

    def record(outcomes):
        item.stash.setdefault(_OUTCOMES, []).append(outcomes)

    return record


def teststatus(rep):
    data = getattr(rep, "zero3", None)
    if data and data["status"] == Outcome.UNSUPPORTED.value and rep.when == "call":
        return "skipped", "u", "UNSUPPORTED"
    return None


def summary(rows) -> dict:
    counts = {k.value: 0 for k in SHOWN}
    for row in rows:
        counts[row["outcome"]] += 1
    counts["total"] = len(rows)
    return counts


def markdown(doc: dict) -> str:
    info = doc["implementation"]
    lines = [
        "## ZeRO-3 conformance",
        "",
        f"Implementation `{info['spec']}` ({info['impl']}); deepspeed {info.get('deepspeed')} "
        f"from `{info.get('deepspeed_path')}`; coordinator `{info.get('coordinator', '?')}`; "
        f"torch {info.get('torch')}; {info['backend']}, {info['world_size']} ranks.",
        "",
        "| contract | statement | result | reason |",
        "|---|---|---|---|",
    ]
    for row in doc["contracts"]:
        reason = row["reason"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['id']} | {row['statement']} | **{Outcome(row['outcome']).label}** | {reason} |")
    s = doc["summary"]
    lines += [
        "",
        ", ".join(f"{s[k.value]} {k.label}" for k in SHOWN if s[k.value]) + f" (of {s['total']} contracts)",
        "",
    ]
    return "\n".join(lines)
