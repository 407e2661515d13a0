"""DeepSpeed's own ZeRO-3 unit tests, stock and with the reference injected (scripts/ds-unit-tests.sh).

Two faces:

* a pytest plugin (``-p ds_unit``) in the run of a DeepSpeed checkout's tests: it keeps the ZeRO-3 tests
  (an item parametrized with a ZeRO stage other than 3 is deselected), checks that the process runs
  the coordinator its mode says, and writes each test's outcome to ``$ZERO3_DS_UNIT_RESULTS`` (JSON);
* ``python ds_unit.py compare STOCK.json REFERENCE.json``: the table of both runs side by side, and
  exit status 1 when the reference loses a test stock passes, except the tests of
  ``conformance/ds_unit_contradictions.toml`` (:func:`load_contradictions`), each of which names the
  contract that contradicts it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

from pytest_zero3.registry import field_problems

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTRADICTIONS = os.path.join(ROOT, "conformance", "ds_unit_contradictions.toml")
#: Parameters by which DeepSpeed's tests pin a ZeRO stage.
STAGE_PARAMS = ("zero_stage", "stage")
#: What the forkserver of DeepSpeed's harness imports before it forks the ranks.
PRELOAD = ("torch", "deepspeed", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.partition_parameters")
#: Outcomes in the order the totals list them.
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "not run")
#: The form of a test ID in the contradictions file: a path in the DeepSpeed checkout, then pytest's node.
TEST_ID = re.compile(r"tests/unit/\S+\.py::\S.*")


@dataclasses.dataclass(frozen=True)
class Contradiction:
    test: str
    contract: str
    reason: str
    since: str = ""


def load_contradictions(path: str = CONTRADICTIONS) -> dict[str, Contradiction]:
    """``{test id: Contradiction}``; a malformed entry raises ValueError naming the test and the field."""
    with open(path, "rb") as fh:
        table = tomllib.load(fh)
    unknown_top = sorted(set(table) - {"tests"})
    if unknown_top:
        raise ValueError(
            f'{os.path.basename(path)}: unknown top-level keys {unknown_top}; entries go under [tests."ID"]'
        )
    out = {}
    for test, entry in table.get("tests", {}).items():
        where = f"{os.path.basename(path)}: [tests.{test!r}]"
        if not TEST_ID.fullmatch(test):
            raise ValueError(
                f"{where}: a test ID is 'tests/unit/<path>.py::<node>', relative to the DeepSpeed checkout"
            )
        problem = field_problems(
            [f for f in ("contract", "reason") if not entry.get(f)],
            sorted(set(entry) - {"contract", "reason", "since"}),
        )
        if problem:
            raise ValueError(f"{where}: {problem}")
        out[test] = Contradiction(test, entry["contract"], entry["reason"], entry.get("since", ""))
    return out


# ---------------------------------------------------------------------------------------------- plugin


_config = None  # the session's config in a run of this plugin (pytest_runtest_logreport is not given it)


def _mode() -> str:
    return os.environ.get("ZERO3_DS_UNIT_MODE", "")


def pytest_configure(config):
    """The coordinator this process builds is the one the mode names: a reference run that silently ran
    stock (or the reverse) would compare nothing."""
    mode = _mode()
    if mode not in ("stock", "reference"):
        return
    import pytest
    from deepspeed.runtime.zero import parameter_offload

    cls = parameter_offload.PartitionedParameterCoordinator
    name = f"{cls.__module__}.{cls.__qualname__}"
    is_reference = name.endswith("reference_impl.coordinator.ReferenceCoordinator")
    if is_reference != (mode == "reference"):
        pytest.exit(f"ds_unit: mode {mode} but this process builds {name}", returncode=4)
    global _config
    config._ds_unit = {"coordinator": name, "results": {}}
    _config = config
    # DeepSpeed's harness forks its ranks from a forkserver: loading deepspeed there once (and, with the
    # reference, installing it there) spares each rank of each test that import, on both sides alike.
    import multiprocessing

    multiprocessing.set_forkserver_preload(["__main__", *PRELOAD])


def pytest_report_header(config):
    state = getattr(config, "_ds_unit", None)
    if state:
        import deepspeed

        return [
            f"ds_unit: {_mode()} run, coordinator {state['coordinator']}, deepspeed {deepspeed.__version__} at {os.path.dirname(deepspeed.__file__)}"
        ]
    return None


def _stage(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name in STAGE_PARAMS:
        if isinstance(params.get(name), int):
            return params[name]
    return None


def pytest_collection_modifyitems(config, items):
    """Deselect the items pinned to ZeRO stage 0, 1 or 2 (the coordinator is ZeRO-3's alone)."""
    if not getattr(config, "_ds_unit", None):
        return
    keep, drop = [], []
    for item in items:
        (drop if _stage(item) not in (None, 3) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _test_id(config, nodeid: str) -> str:
    checkout = os.environ.get("ZERO3_DS_UNIT_CHECKOUT") or str(config.rootpath)
    prefix = os.path.relpath(str(config.rootpath), checkout)
    return nodeid if prefix == "." else f"{prefix}/{nodeid}"


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0][:300] if crash.message else ""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])[:300]
    text = str(report.longrepr or "").strip().splitlines()
    errors = [line for line in text if line.startswith("E ")]
    return (errors[-1] if errors else (text[-1] if text else ""))[:300]


def pytest_runtest_logreport(report):
    config = _config
    state = getattr(config, "_ds_unit", None)
    if not state:
        return
    results = state["results"]
    tid = _test_id(config, report.nodeid)
    current = results.get(tid, {}).get("outcome")
    xfail = hasattr(report, "wasxfail")
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.passed:
            outcome = "xpassed" if xfail else "passed"
        elif report.skipped:
            outcome = "xfailed" if xfail else "skipped"
        else:
            outcome = "failed" if report.when == "call" else "error"
    elif report.when == "teardown" and report.failed and current in ("passed", None):
        outcome = "error"
    else:
        return
    results[tid] = {"outcome": outcome, "message": "" if outcome == "passed" else _message(report)}


def pytest_sessionfinish(session, exitstatus):
    state = getattr(session.config, "_ds_unit", None)
    out = os.environ.get("ZERO3_DS_UNIT_RESULTS")
    if not state or not out:
        return
    import deepspeed

    data = {
        "mode": _mode(),
        "checkout": os.environ.get("ZERO3_DS_UNIT_CHECKOUT", ""),
        "deepspeed": f"{deepspeed.__version__} at {os.path.dirname(deepspeed.__file__)}",
        "coordinator": state["coordinator"],
        "exitstatus": int(exitstatus),
        "results": state["results"],
    }
    with open(out, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)


# --------------------------------------------------------------------------------------------- compare


def compare(stock: dict, reference: dict, contradictions: dict[str, Contradiction]) -> tuple[list, list, list]:
    """``(rows, new failures, stale entries)``: one row ``(test, stock, reference, note)`` per test of
    either run; a new failure is a test stock passes that the reference does not (not listed in the
    contradictions); a stale entry is a listed test the reference now passes."""
    s, r = stock.get("results", {}), reference.get("results", {})
    rows, new, stale = [], [], []
    for test in sorted(set(s) | set(r)):
        a = s.get(test, {}).get("outcome", "not run")
        b = r.get(test, {}).get("outcome", "not run")
        note = ""
        listed = contradictions.get(test)
        if a == "passed" and b not in ("passed", "xpassed"):
            if listed:
                note = f"contradicts {listed.contract}"
            else:
                note = "NEW: " + (r.get(test, {}).get("message") or b)
                new.append(test)
        elif listed and b == "passed":
            note = f"listed ({listed.contract}) but passes"
            stale.append(test)
        elif a != b:
            note = "differs: " + (r.get(test, {}).get("message") or s.get(test, {}).get("message") or "")
        rows.append((test, a, b, note))
    return rows, new, stale


def totals(rows, column: int) -> str:
    counts = {o: 0 for o in OUTCOMES}
    for row in rows:
        counts[row[column]] = counts.get(row[column], 0) + 1
    return ", ".join(f"{n} {o}" for o, n in counts.items() if n)


def render(rows, new, stale, stock: dict, reference: dict, contradictions) -> str:
    width = max([len("test")] + [len(r[0]) for r in rows])
    lines = [f"{'test':<{width}}  {'stock':<8}  {'reference':<9}  note", "-" * (width + 32)]
    lines += [f"{t:<{width}}  {a:<8}  {b:<9}  {n}" for t, a, b, n in rows]
    lines += [
        "",
        f"stock     ({stock.get('deepspeed', '?')}): {totals(rows, 1)}",
        f"reference ({reference.get('coordinator', '?')}): {totals(rows, 2)}",
        f"contradicted on purpose: {sum(1 for r in rows if r[3].startswith('contradicts'))} of {len(contradictions)} listed",
    ]
    if stale:
        lines.append(
            f"listed but passing with the reference (remove from the contradictions file?): {', '.join(stale)}"
        )
    lines.append(f"new reference failures (stock passes): {len(new)}")
    lines += [f"  {t}" for t in new]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="print both runs side by side; exit 1 on a new reference failure")
    cmp.add_argument("stock")
    cmp.add_argument("reference")
    cmp.add_argument("--contradictions", default=CONTRADICTIONS)
    cmp.add_argument("--markdown", help="also write the table as Markdown to this file")
    args = parser.parse_args(argv)
    with open(args.stock) as fh:
        stock = json.load(fh)
    with open(args.reference) as fh:
        reference = json.load(fh)
    contradictions = load_contradictions(args.contradictions)
    rows, new, stale = compare(stock, reference, contradictions)
    print(render(rows, new, stale, stock, reference, contradictions))
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("| test | stock | reference | note |\n|---|---|---|---|\n")
            fh.writelines(f"| `{t}` | {a} | {b} | {n.replace('|', '/')} |\n" for t, a, b, n in rows)
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
