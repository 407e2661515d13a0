"""The conformance report: one row per contract ID, in the terminal, as JSON and as Markdown.

Rows are built from test reports (``pytest_runtest_logreport``), so the table is right under
``pytest -n`` too: workers attach a small JSON-able ``zero3`` dict to each contract test's report,
and whichever process prints the summary aggregates them.  Registered contracts (see
:mod:`pytest_zero3.registry`) that were selected but did not run get a ``not_run`` row.

Outcomes are pytest's own, read, never rewritten: a contract listed in ``--zero3-expect`` carries an
``xfail`` mark (``known_failure`` is its XFAIL, ``unexpected_pass`` its XPASS), ``unsupported`` is a
skip raised as :class:`~pytest_zero3.scenario.Unsupported`, ``world_error`` a world that did not form
(counted apart from contract failures).  So ``--runxfail``, junitxml and other plugins see the same.

JSON (``schema: "pytest-zero3/report"``, ``version: 4``), specified by ``report.schema.json`` next to
this module::

    {"schema": "pytest-zero3/report", "version": 4,
     "implementation": {"spec", "impl", "deepspeed", "deepspeed_path", "coordinator", "torch",
                        "backend", "world_size"},
     "baseline": null | {"implementation", "summary", "run", "verdict": {"regression": n, ...}},
     "summary": {"pass": n, "fail": n, "world_error": n, "known_failure": n, "unexpected_pass": n,
                 "unsupported": n, "skipped": n, "not_run": n, "total": n},
     "contracts": [{"id", "family", "statement", "source", "outcome", "reason", "message",
                    "expected_cause", "duration", "tests": [nodeid],
                    "ranks": [{"rank", "status", "message", "traceback"}],
                    "baseline": null | {"outcome", "reason", "message"}, "verdict"}],
     "surface": null | {"source", "total", "driven", "with_reason", "reasons", "gaps", "unknown", "missing"}}

``reason`` is the expectation's reason for a known failure; ``message`` is the failure itself (fail
and known_failure), so a report made with an expectations file still shows what failed;
``expected_cause`` is the cause the expectations file pins ("" when none).

``outcome`` is one of the :class:`~pytest_zero3.outcome.Outcome` values (stable lowercase words).
``verdict`` compares it with the baseline's (:func:`pytest_zero3.baseline.verdict`).  ``surface`` is
the ZeRO-3 surface map's coverage of the implementation (:mod:`pytest_zero3.fixtures.pytest_side.surface`; optional,
absent in older reports).  Version 4
added the baseline fields; version 3 added ``world_error`` and ``expected_cause``; version 2 had
neither; version 1 used "FAIL", "known failure" and "unexpected pass" and had no "not_run" or "source".
"""

from __future__ import annotations

import json
import os
import warnings

import pytest

from pytest_zero3 import accel, baseline, expectations, impl, launcher, markers, registry
from pytest_zero3.outcome import SEVERITY, Outcome, first_failure
from pytest_zero3.scenario import Unsupported
from pytest_zero3.world import WorldFailure, WorldNotFormed

SCHEMA, SCHEMA_VERSION = "pytest-zero3/report", 4
#: The ``record_property`` name under which the seq family's test hands its drawn pairs to the report.
PAIRS_PROPERTY = "zero3_pairs"
#: The JSON Schema of the report (shipped with the package; scripts/render_matrix.py validates against it).
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")
#: The terminal's and the summary's order.
SHOWN = (
    Outcome.PASS,
    Outcome.FAIL,
    Outcome.WORLD_ERROR,
    Outcome.KNOWN_FAILURE,
    Outcome.UNEXPECTED_PASS,
    Outcome.UNSUPPORTED,
    Outcome.SKIPPED,
    Outcome.NOT_RUN,
)
_COLOURS = {
    Outcome.FAIL: {"red": True, "bold": True},
    Outcome.WORLD_ERROR: {"red": True},
    Outcome.UNEXPECTED_PASS: {"yellow": True},
    Outcome.KNOWN_FAILURE: {"yellow": True},
    Outcome.UNSUPPORTED: {"cyan": True},
    Outcome.PASS: {"green": True},
    Outcome.NOT_RUN: {"yellow": True},
}

#: The widest outcome label: the width of the baseline's column.
_LABEL_WIDTH = max(len(o.label) for o in Outcome)
_VERDICT_COLOURS = {
    baseline.REGRESSION: {"red": True, "bold": True},
    baseline.IMPROVEMENT: {"green": True, "bold": True},
    baseline.CHANGED: {"yellow": True},
}

_OUTCOMES: pytest.StashKey[list] = pytest.StashKey()


class Report:
    """The rows of one session, and what prints and writes them."""

    def __init__(self, config, settings, reports: bool = True):
        """``reports``: whether this process prints the table and writes the files (the session
        decides: not an xdist worker, not a launcher rank other than 0).  Its report paths are
        checked here, before any world starts."""
        self.config, self.settings, self.reports = config, settings, reports
        self.expected = expectations.load(settings.expect)
        self.baseline: dict | None = None  # the baseline's report (--zero3-baseline), once it ran
        self.strict = settings.strict
        self.rows: dict[str, dict] = {}  # contract id -> row dict
        self.identity: dict = {}
        self.write_errors: list[str] = []  # one line per report file that could not be written at the end
        self._pending: dict[
            str, dict
        ] = {}  # listed contract of several tests -> {"left": to run, "passed": n, "total": n}
        self._suite_configs: dict[str, dict] = {}  # profile -> the suite's config under it, flattened
        self.pairs: dict[str, dict] = {}  # kind -> {"allowed": n, "pairs": drawn pairs}: the seq family's draw
        if reports:
            for option, path in (("--zero3-report", settings.report), ("--zero3-report-md", settings.report_md)):
                check_writable(option, path)

    def header_lines(self) -> list:
        settings = self.settings
        info = impl.describe_without_import(settings.spec)
        lines = [
            f"zero3: impl={info['spec']} ({info['impl']})",
            f"zero3: deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path', '?')}, torch {info['torch']}",
            f"zero3: backend={settings.backend}, world size={self.world_size()}, timeout={settings.timeout:g}s",
            accel.header(settings.backend, self.world_size()),
        ]
        if settings.spec.kind == "class":
            lines.append(f"zero3: coordinator={settings.spec.module}:{settings.spec.cls_name}")
        if settings.baseline is not None:
            lines.append(f"zero3: baseline={settings.baseline.text} ({settings.baseline.label}), judged against it")
        if settings.profile != ("fp32",) or settings.config or not settings.poison:
            from pytest_zero3.fixtures.pytest_side import (
                profile_options,  # lazy: the suite's package, loaded by a session that uses it
            )

            lines.append("zero3: " + profile_options.report_header(settings))
        from pytest_zero3.fixtures.rule import zero_keys

        keys = zero_keys.header(info.get("deepspeed_path", ""))
        if keys:  # a fork's own ZeRO keys, or ones it lacks: what the rule family's draw leaves out
            lines.append("zero3: " + keys)
        from pytest_zero3.fixtures.pytest_side import surface

        entries = surface.header(info.get("deepspeed_path", ""))
        if entries:  # a fork's own ZeRO-3 entry points, options or config keys, or ones it lacks
            lines.append("zero3: " + entries)
        lines += [f"zero3: warning: {w}" for w in [impl.base_warning(settings.spec)] if w]
        return lines

    def world_size(self) -> int:
        """The size of the world that runs: torchrun's (``WORLD_SIZE``) in launcher mode, where the
        option's value is not used, else the option's."""
        return int(os.environ["WORLD_SIZE"]) if launcher.active() else self.settings.world_size

    def use_baseline(self, doc: dict) -> None:
        """Take the baseline's results: each contract failing there is expected to fail here (an entry
        of the expectations file wins for its contract)."""
        assert self.settings.baseline is not None
        self.baseline = doc
        self.expected = {**baseline.expected_failures(doc, baseline.label(self.settings.baseline)), **self.expected}

    def check_expectations(self, items) -> None:
        """Warn about listed IDs that name no contract (all collected items: before any deselection)."""
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

    def mark_expected(self, items) -> None:
        """Turn each listed contract's tests (the ones that will run) into pytest ``xfail``\\ s.

        ``raises=KnownFailure``: only a failure of the listed cause is one (see
        :func:`pytest_zero3.expectations.judge`).  ``--zero3-strict`` is pytest's ``strict`` for a
        contract of one test that the expectations file lists (one the baseline fails is never strict:
        passing it here is an improvement).  A contract of several tests (parametrised) is listed as a
        whole: some of its tests may pass (000-d passes with prefetch off), so its marks are not strict; under
        ``--zero3-strict`` its last test fails in teardown when every one of its tests passed
        (see :meth:`strict_teardown`)."""
        tests: dict[str, list] = {}
        for item in items:
            c = markers.contract(item)
            if c:
                item.user_properties.append(("zero3_contract", c[0]))
                if self._listed(item, c[0]) is not None:
                    tests.setdefault(c[0], []).append(item)
        for cid, group in tests.items():
            strict = self.strict and self.expected[cid].from_file
            if len(group) > 1 and strict:
                self._pending[cid] = {"left": len(group), "passed": 0, "total": len(group)}
            for item in group:
                expected = self._listed(item, cid)
                item.add_marker(
                    pytest.mark.xfail(
                        reason=f"known failure {cid}: {expected.reason}",
                        strict=strict and len(group) == 1,
                        raises=expectations.KnownFailure,
                    )
                )

    def strict_teardown(self, item) -> None:
        """Under ``--zero3-strict``: fail the last test of a listed contract of several tests when all
        of them passed (pytest makes it a teardown error).  Counts this process's tests: under
        ``pytest -n`` it applies where one worker ran all of a contract's tests."""
        c = markers.contract(item)
        state = self._pending.get(c[0]) if c and self.strict else None
        if state is None or state["left"] > 0:
            return
        del self._pending[c[0]]
        if state["passed"] == state["total"]:
            pytest.fail(
                f"--zero3-strict: every test of contract {c[0]} passed, but --zero3-expect lists it as failing: "
                "remove it from the expectations file.",
                pytrace=False,
            )

    def expectation(self, item):
        """``(contract id, Expectation)`` of a listed contract test, else None."""
        c = markers.contract(item)
        expected = self._listed(item, c[0]) if c else None
        return None if expected is None else (c[0], expected)

    def _listed(self, item, cid: str):
        """The Expectation listing contract ``cid``'s test ``item`` (its profile's), else None."""
        expected = self.expected.get(cid)
        if expected is None:
            return None
        profile = markers.profile(item)
        return expected.listing(profile, markers.variant(item), lambda: self._suite_config(profile))

    def _suite_config(self, profile: str) -> dict:
        """The suite's config under ``profile`` and ``--zero3-config``, flattened (an expectation's ``when``)."""
        if profile not in self._suite_configs:
            from pytest_zero3.fixtures import profiles  # lazy: the suite's package, asked only by a `when`
            from pytest_zero3.fixtures.pytest_side import profile_options

            self._suite_configs[profile] = profiles.suite_config(
                profile, profile_options.config_overlay(self.settings), self.settings.world_size
            )
        return self._suite_configs[profile]

    def on_report(self, item, call, rep) -> None:
        """Read a contract test's outcome, as pytest made it, into the small ``zero3`` dict of its report."""
        c = markers.contract(item)
        if c is None or not (rep.when == "call" or (rep.when == "setup" and not rep.passed)):
            return
        cid, statement = c
        expected = self._listed(item, cid)
        status, reason, message = classify(call, rep, expected)
        state = self._pending.get(cid)
        if state is not None and rep.when == "call":
            state["left"] -= 1
            state["passed"] += status == Outcome.UNEXPECTED_PASS
        ranks = []
        for outcomes in item.stash.get(_OUTCOMES, []):
            ranks = [dict(rank=o.rank, status=o.status, message=o.message, traceback=o.traceback) for o in outcomes]
            if any(o.status != "passed" for o in outcomes):
                break
        identity: dict = next((o.identity for outs in item.stash.get(_OUTCOMES, []) for o in outs if o.identity), {})
        failed = status in (Outcome.FAIL, Outcome.KNOWN_FAILURE, Outcome.WORLD_ERROR)
        judged, unexplained = judged_problems(call, expected) if failed else (0, [])
        rep.zero3 = dict(
            id=cid,
            statement=statement,
            status=status.value,
            reason=reason,
            problems=failure_problems(call) if failed else [],
            judged=judged,
            explained=judged - len(unexplained),
            unexplained=unexplained,
            message=message if failed else "",
            expected_cause=expected.cause if expected else "",
            ranks=ranks if failed else [],
            identity=identity,
            pairs=dict(rep.user_properties).get(PAIRS_PROPERTY) or {},
        )

    def add(self, rep) -> None:
        """Fold one test report (from this process or an xdist worker) into its contract's row."""
        data = getattr(rep, "zero3", None)
        if not data:
            return
        if data.get("identity") and not self.identity:
            self.identity = dict(data["identity"])
        if (data.get("identity") or {}).get("frameworks") and not self.identity.get("frameworks"):
            self.identity["frameworks"] = data["identity"]["frameworks"]  # the first run that loaded them
        for kind, drawn in (data.get("pairs") or {}).items():  # a union over the tests (and xdist workers)
            mine = self.pairs.setdefault(kind, {"allowed": drawn["allowed"], "pairs": []})
            mine["pairs"] = sorted(set(mine["pairs"]) | set(drawn["pairs"]))
        status = Outcome(data["status"])
        row = self.rows.setdefault(data["id"], _row(data["id"], data["statement"]))
        row["duration"] += rep.duration
        row["tests"].append(rep.nodeid)
        row["problems"] += [k for k in data.get("problems", []) if k not in row["problems"]]
        row["judged"] += data.get("judged", 0)
        row["unexplained"] += [u for u in data.get("unexplained", []) if u not in row["unexplained"]]
        row["explained"] += data.get("explained", 0)
        if SEVERITY.index(status) < SEVERITY.index(Outcome(row["outcome"])) or len(row["tests"]) == 1:
            row.update(
                outcome=status.value,
                reason=data["reason"],
                message=data["message"],
                expected_cause=data.get("expected_cause", ""),
                ranks=data["ranks"],
            )

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
        base = baseline.rows(self.baseline)
        out = []
        for cid in sorted(rows):
            row = dict(rows[cid])
            theirs = base.get(cid)
            row["baseline"] = {k: theirs[k] for k in ("outcome", "reason", "message")} if theirs else None
            row["verdict"] = baseline.verdict(
                row["outcome"], theirs["outcome"] if theirs else None, row["reason"].startswith((BEHIND, ANOTHER))
            )
            out.append(row)
        return out

    def baseline_implementation(self) -> dict | None:
        """The baseline's part of the JSON report: what ran, its summary, and the verdict's counts."""
        if self.baseline is None:
            return None
        verdicts = [r["verdict"] for r in self.all_rows() if r["verdict"]]
        return dict(
            implementation=self.baseline["implementation"],
            summary=self.baseline["summary"],
            run=self.baseline.get("baseline_run", {}),
            verdict={v: verdicts.count(v) for v in (baseline.REGRESSION, baseline.IMPROVEMENT, baseline.CHANGED)},
        )

    def implementation(self) -> dict:
        info = impl.describe_without_import(self.settings.spec)
        info.update(backend=self.settings.backend, world_size=self.world_size())
        from pytest_zero3.fixtures.pytest_side import (
            profile_options,  # lazy: the suite's package, loaded by a session that uses it
        )

        info.update(profile_options.report_implementation(self.settings))
        info.update(self.identity)  # what the ranks actually ran wins over what was predicted
        return info

    def terminal_summary(self, tr) -> None:
        if not self.reports:
            return
        if self.rows:
            self._table(tr)
        for line in self.write_errors:  # after the table and its summary: the results are on screen
            tr.write_line(line, red=True, bold=True)

    def _table(self, tr) -> None:
        rows = self.all_rows()
        info = self.implementation()
        tr.write_sep("=", "ZeRO-3 conformance")
        tr.write_line(f"implementation: {info['spec']} ({info['impl']})")
        tr.write_line(f"deepspeed {info.get('deepspeed')} from {info.get('deepspeed_path')}")
        tr.write_line(
            f"coordinator: {info.get('coordinator', '?')}; torch {info.get('torch')}; "
            f"accelerator {info.get('accelerator', '?')}; backend {info['backend']}; world size {info['world_size']}"
        )
        if info.get("frameworks"):
            tr.write_line(f"frameworks: {info['frameworks']}")
        if self.settings.profile != ("fp32",):
            tr.write_line(f"profiles: {', '.join(self.settings.profile)}")
        if self.settings.config:
            from pytest_zero3.fixtures.pytest_side import profile_options

            tr.write_line(profile_options.summary_line(self.settings))
        warning = impl.base_warning(self.settings.spec)
        if warning:
            tr.write_line(f"warning: {warning}", yellow=True)
        if self.baseline is not None:
            theirs = self.baseline["implementation"]
            tr.write_line(
                f"baseline: {theirs['spec']} ({theirs['impl']}), deepspeed {theirs.get('deepspeed')} "
                f"from {theirs.get('deepspeed_path')}"
            )
        tr.write_line("")
        width = min(max(len(r["statement"]) for r in rows), 70)
        not_run = [r for r in rows if r["outcome"] == Outcome.NOT_RUN.value]
        shown = rows
        if len(not_run) > NOT_RUN_ROWS:  # a -k or --zero3-select run: one line, not a screenful
            shown = [r for r in rows if r["outcome"] != Outcome.NOT_RUN.value]
        base_spec = self.baseline["implementation"]["spec"] if self.baseline is not None else None
        columns = base_spec is not None  # a column per implementation, and the verdict
        ours = max(len(Outcome(r["outcome"]).label) for r in shown) if shown else 0
        if columns:
            ours = max(ours, len("candidate"))
            tr.write_line(f"  {'':<7} {'':<{width}}  {'candidate':<{ours}}  baseline")
        for row in shown:
            text = row["statement"] if len(row["statement"]) <= width else row["statement"][: width - 1] + "…"
            outcome = Outcome(row["outcome"])
            tr.write(f"  {row['id']:<7} {text:<{width}}  ")
            tr.write(f"{outcome.label:<{ours}}" if columns else outcome.label, **_COLOURS.get(outcome, {}))
            reason = f"  ({row['reason']})" if row["reason"] and outcome != Outcome.PASS else ""
            if columns:
                theirs = Outcome(row["baseline"]["outcome"]) if row["baseline"] else None
                text = theirs.label if theirs else "-"
                width_theirs = _LABEL_WIDTH if row["verdict"] or reason else 0
                tr.write(f"  {text:<{width_theirs}}", **_COLOURS.get(theirs, {}) if theirs else {})
                if row["verdict"]:
                    tr.write(f"  {row['verdict']:<{len(baseline.IMPROVEMENT)}}", **_VERDICT_COLOURS[row["verdict"]])
            tr.write_line(reason)
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
        if counts["problems_judged"]:
            tr.write_line(problems_line(counts))
        if base_spec is not None:
            tr.write_line(verdict_line(rows, base_spec))
        covered = self.surface()
        if covered is not None:
            tr.write_line(surface_line(covered, GAPS_SHOWN))
        pairs = self.pairs_doc()
        if pairs:
            tr.write_line(pairs_line(pairs))

    def pairs_doc(self) -> dict | None:
        """The pairs the seq family drew, by kind, against all it allows (None: the family did not run)."""
        if not self.pairs:
            return None
        return {
            kind: {"drawn": len(v["pairs"]), "allowed": v["allowed"], "pairs": v["pairs"]}
            for kind, v in self.pairs.items()
        }

    def surface(self) -> dict | None:
        """The surface map's coverage of the implementation (None where it cannot be read)."""
        from pytest_zero3.fixtures.pytest_side import (
            surface,  # lazy: the suite's package, loaded by a session that uses it
        )

        covered = surface.summary(impl.describe_without_import(self.settings.spec).get("deepspeed_path", ""))
        return covered.as_dict() if covered is not None else None

    def unexpected_passes(self) -> list:
        """Contracts the expectations file lists that passed (a baseline's failure passing is an improvement)."""
        return sorted(
            cid
            for cid, row in self.rows.items()
            if row["outcome"] == Outcome.UNEXPECTED_PASS.value and cid in self.expected and self.expected[cid].from_file
        )

    def session_finish(self, session) -> None:
        """Write the JSON and Markdown reports; a failed write is told after the table, not raised."""
        if not self.reports:
            return
        rows = self.all_rows() if self.rows else []
        doc = dict(
            schema=SCHEMA,
            version=SCHEMA_VERSION,
            implementation=self.implementation(),
            baseline=self.baseline_implementation(),
            summary=summary(rows),
            contracts=rows,
            surface=self.surface(),
            pairs=self.pairs_doc(),
        )
        for option, path, render in (
            ("--zero3-report", self.settings.report, lambda: json.dumps(doc, indent=2)),
            ("--zero3-report-md", self.settings.report_md, lambda: markdown(doc)),
        ):
            if not path:
                continue
            try:
                with open(path, "w") as fh:
                    fh.write(render())
            except OSError as exc:
                self.write_errors.append(
                    f"{option}={path}: the report could not be written ({exc.strerror or exc}); "
                    "the results above are all this run kept."
                )


def check_writable(option: str, path) -> None:
    """Create ``path``'s parent directories and make sure the file can be written; else a usage error."""
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        existed = os.path.exists(path)
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as exc:
        raise pytest.UsageError(
            f"{option}={path}: cannot write there ({exc.strerror or exc}); give a writable path."
        ) from None


#: How a failure's reason begins where its listed cause explains some of its problems, not all, and
#: where it explains none: either way the failure has problems its listing does not have.
BEHIND, ANOTHER = "behind its known failure", "failed for another cause"


def _judged_cause(call) -> BaseException | None:
    """The failure a contract test's problems are read from: the test's own exception (the cause an
    expectation wrapped), none for a skip, an xfail or a world that never formed."""
    exc = call.excinfo.value if call.excinfo is not None else None
    cause = exc.cause if isinstance(exc, (expectations.KnownFailure, expectations.CauseMismatch)) else exc
    if cause is None or isinstance(cause, (pytest.skip.Exception, pytest.xfail.Exception, WorldNotFormed)):
        return None
    return cause


def judged_problems(call, expected) -> tuple[int, list[str]]:
    """``(judged, unexplained)`` of a failed test: how many problems it has, each judged apart against
    the contract's entry (``expectations.problems``), and those the entry does not explain (all of them
    where it has none), one line each: what an entry still has to name, where the failure's own text
    shows only the first :data:`~pytest_zero3.expectations.SHOWN`."""
    cause = _judged_cause(call)
    if cause is None:
        return 0, []
    found = expectations.problems(cause)
    left = expected.unexplained(cause) if expected is not None else found
    return len(found), [expectations.one_line(p) for p in left]


def problems_line(counts: dict) -> str:
    """The run's judgement in one line: problems judged one by one, and how many a known failure explains."""
    judged, explained = counts.get("problems_judged", 0), counts.get("problems_explained", 0)
    return f"problems: {judged} judged one by one, {explained} explained by a known failure, {judged - explained} not"


def failure_problems(call) -> list[str]:
    """The keys of a failed test's problems (``expectations.problem_key``), for the report and a later
    ``--zero3-baseline`` verdict by problem."""
    cause = _judged_cause(call)
    return [] if cause is None else [expectations.problem_key(p) for p in expectations.problems(cause)]


def classify(call, rep, expected):
    """``(Outcome, reason, message)`` of one contract test report, read from what pytest made of it.

    ``message`` is the failure itself (kept for a known failure too: the report still shows what failed).
    """
    exc = call.excinfo.value if call.excinfo is not None else None
    cause = exc.cause if isinstance(exc, (expectations.KnownFailure, expectations.CauseMismatch)) else exc
    message = ""
    if cause is not None and not isinstance(cause, (pytest.skip.Exception, pytest.xfail.Exception)):
        if isinstance(cause, WorldFailure):
            message = first_failure(cause.outcomes) if cause.outcomes else str(cause).strip()
        else:
            message = pytest.ExceptionInfo.from_exception(cause).exconly()[:4000]  # assertion detail is evidence
    first = (message.splitlines() or [""])[0]
    if cause is not None and isinstance(cause, WorldNotFormed):
        return Outcome.WORLD_ERROR, first, message
    if rep.skipped and hasattr(rep, "wasxfail"):
        if expected is not None:
            return Outcome.KNOWN_FAILURE, expected.reason, message
        return Outcome.SKIPPED, rep.wasxfail, message  # the test's own pytest.xfail()
    if rep.skipped and isinstance(exc, Unsupported):
        return Outcome.UNSUPPORTED, str(exc.msg), message
    if rep.skipped:
        return Outcome.SKIPPED, rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr), message
    if expected is not None and (hasattr(rep, "wasxfail") or (rep.failed and exc is None)):
        # passed although listed: pytest's xpass, a failure (strict xpass) under --zero3-strict
        listed = f"listed in --zero3-expect: {expected.reason}" if expected.from_file else expected.reason
        return Outcome.UNEXPECTED_PASS, listed, message
    if isinstance(exc, expectations.CauseMismatch):
        if exc.behind:
            return (
                Outcome.FAIL,
                f"{BEHIND}, {len(exc.unexplained)} problem(s) {expected.source} does not explain "
                f"(first: {exc.first_unexplained[:300]})",
                message,
            )
        return (
            Outcome.FAIL,
            f"{ANOTHER} than {expected.source} lists (expected: it {expected.cause}; got: {first})",
            message,
        )
    if rep.failed:
        return Outcome.FAIL, first, message
    return Outcome.PASS, "", message


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
        expected_cause="",
        duration=0.0,
        tests=[],
        ranks=[],
        problems=[],
        judged=0,
        explained=0,
        unexplained=[],
    )


def recorder(item):
    """Callback given to worlds: keeps each run's per-rank outcomes on the test item."""

    def record(outcomes):
        item.stash.setdefault(_OUTCOMES, []).append(outcomes)

    return record


def summary(rows) -> dict:
    counts = {k.value: 0 for k in SHOWN}
    for row in rows:
        counts[row["outcome"]] += 1
    counts["total"] = len(rows)
    counts["problems_judged"] = sum(row.get("judged", 0) for row in rows)
    counts["problems_explained"] = sum(row.get("explained", 0) for row in rows)
    return counts


def markdown(doc: dict) -> str:
    info = doc["implementation"]
    theirs = (doc.get("baseline") or {}).get("implementation")
    lines = [
        "## ZeRO-3 conformance",
        "",
        f"Implementation `{info['spec']}` ({info['impl']}); deepspeed {info.get('deepspeed')} "
        f"from `{info.get('deepspeed_path')}`; coordinator `{info.get('coordinator', '?')}`; "
        f"torch {info.get('torch')}; {info.get('accelerator', '?')} accelerator, {info['backend']}, "
        f"{info['world_size']} ranks.",
        "",
    ]
    if info.get("frameworks"):
        lines += [f"Frameworks: {info['frameworks']}.", ""]
    overlay = info.get("config_overlay")
    if overlay:
        changed = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in (overlay.get("effective") or {}).items())
        lines += [f"Config overlay `{overlay['file']}`; changed: {changed or 'nothing'}.", ""]
    if theirs:
        lines += [
            f"Baseline `{theirs['spec']}` ({theirs['impl']}); deepspeed {theirs.get('deepspeed')} "
            f"from `{theirs.get('deepspeed_path')}`.",
            "",
            "| contract | statement | candidate | baseline | change | reason |",
            "|---|---|---|---|---|---|",
        ]
    else:
        lines += ["| contract | statement | result | reason |", "|---|---|---|---|"]
    for row in doc["contracts"]:
        reason = row["reason"].replace("|", "\\|").replace("\n", " ")
        if row.get("explained"):
            reason = f"{row['explained']} of {row['judged']} problems explained by a known failure; {reason}"
        elif row.get("judged"):
            reason = f"{row['judged']} problem(s); {reason}"
        result = f"**{Outcome(row['outcome']).label}**"
        if theirs:
            base = Outcome(row["baseline"]["outcome"]).label if row.get("baseline") else "-"
            change = f"**{row['verdict']}**" if row.get("verdict") else ""
            result = f"{result} | {base} | {change}"
        lines.append(f"| {row['id']} | {row['statement']} | {result} | {reason} |")
    s = doc["summary"]
    lines += ["", ", ".join(f"{s[k.value]} {k.label}" for k in SHOWN if s[k.value]) + f" (of {s['total']} contracts)"]
    if s.get("problems_judged"):
        lines += ["", problems_line(s)]
    if theirs:
        lines += ["", verdict_line(doc["contracts"], theirs["spec"])]
    if doc.get("surface"):
        lines += ["", surface_line(doc["surface"])]
    return "\n".join([*lines, ""])


#: Gaps named in the terminal's coverage line; the Markdown and JSON reports name every one.
GAPS_SHOWN = 8


def surface_line(covered: dict, gaps_shown: int | None = None) -> str:
    """The surface map's coverage in one line: counts, then the gaps by name (options beside their
    entry; ``gaps_shown``: the first so many, then a count)."""
    from pytest_zero3.fixtures.pytest_side import surface

    kinds = ", ".join(f"{n} {surface.KINDS[k]}" for k, n in covered["reasons"].items() if k != "gap" and n)
    text = (
        f"ZeRO-3 surface: {covered['total']} entries, {covered['driven']} driven by a contract, "
        f"{covered['with_reason']} with a reason ({kinds}), {len(covered['gaps'])} not yet driven"
    )
    if covered["gaps"]:
        names = surface.grouped(covered["gaps"])
        shown = names if gaps_shown is None else names[:gaps_shown]
        more = f" and {len(names) - len(shown)} more (the reports list them)" if len(shown) < len(names) else ""
        text += ": " + ", ".join(shown) + more
    if covered["unknown"]:
        text += f"; not in the map: {', '.join(covered['unknown'])}"
    return text


def pairs_line(pairs: dict) -> str:
    """One line: the pairs the seq family drew of each kind, against all the space allows (issue 54), and
    how to draw the rest where some are missing."""
    drawn = sum(v["drawn"] for v in pairs.values())
    allowed = sum(v["allowed"] for v in pairs.values())
    kinds = ", ".join(f"{kind} {v['drawn']}/{v['allowed']}" for kind, v in pairs.items())
    more = (
        "; --zero3-examples=N draws more (with --zero3-seed=date, a week of runs or N=64 in one draws all)"
        if drawn < allowed
        else ""
    )
    return f"pairs drawn (seq family): {drawn} of {allowed} ({kinds}){more}"


def verdict_line(rows, spec: str) -> str:
    """One line: how the candidate differs from the baseline ``spec``, contract by contract."""
    parts = []
    for word in (baseline.REGRESSION, baseline.IMPROVEMENT, baseline.CHANGED):
        ids = [r["id"] for r in rows if r.get("verdict") == word]
        if ids:
            parts.append(f"{len(ids)} {word}{'s' if len(ids) > 1 else ''} ({', '.join(ids)})")
    return f"against the baseline {spec}: " + (", ".join(parts) if parts else "no difference")
