"""The manual's generated parts, made from their single sources at build time (nothing generated is committed).

A page asks for a part with a line ``<!-- gen:NAME -->``; :func:`fill` replaces it with ``PARTS[NAME]()``.
``docs/hooks.py`` calls :func:`fill` on every page while mkdocs builds (``tox -e docs``), and
``tests/test_docs.py`` checks, without mkdocs, that every part renders and covers its source:

* ``contracts``: every contract of ``conformance/contracts.toml``, by family, with the docstrings of its
  scenario (``@contract`` under ``fixtures/``; a batched family's marked test in ``conformance/test_*.py``)
  and of their module;
* ``registry``: the registry as one table (ID, statement, source, ranks);
* ``proofs``: the proof table, from ``tests/flags.py``;
* ``options``: the option table, from ``pytest_zero3.options.OPTIONS``;
* ``expectations``: the known failures of each release, from ``conformance/expectations/*.toml``;
* ``bugs``: where the expectations files list each new DeepSpeed bug the suite found;
* ``stock-failures``: what the newest release's expectations file lists, by profile (the counts the
  README states are checked against the same functions by ``tests/test_docs.py``);
* ``matrix-releases``: the releases of the release matrix (``pytest_zero3/impl.py``), and which of them
  the committed table has results for;
* ``fork-ci``: the fork CI workflow, ``examples/fork-ci.yml``.

Nothing here imports torch or deepspeed: the sources are read as text, TOML and Python syntax trees.
"""

from __future__ import annotations

import ast
import functools
import html
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- gen:([a-z-]+) -->$", re.M)


def _imports():
    """This checkout's packages and ``tests/flags.py`` first on the path, as the tests have them."""
    for p in (str(ROOT / "tests"), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)


def _contracts() -> dict:
    _imports()
    from pytest_zero3 import registry

    return registry.load(str(ROOT / "conformance" / "contracts.toml"))


# Families in the order of the manual; a family not listed here comes after them, in name order.
FAMILY_ORDER = ("000", "001", "002", "003", "004", "005", "006", "007", "008", "rule", "zoo", "base")


def _family_key(name: str):
    return (FAMILY_ORDER.index(name), "") if name in FAMILY_ORDER else (len(FAMILY_ORDER), name)


def _ranks(c) -> str:
    return f"≥ {c.min_world_size}" if c.min_world_size > 1 else "any"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    """A code span that survives a table cell: a pipe in backticks would show its escaping backslash."""
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def registry_table() -> str:
    lines = ["| ID | statement | source | ranks |", "|---|---|---|---|"]
    for c in sorted(_contracts().values(), key=lambda c: (_family_key(c.family), c.id)):
        lines.append(f"| [{c.id}](#{anchor(c.id)}) | {_cell(c.statement)} | {_cell(c.source)} | {_ranks(c)} |")
    return "\n".join(lines)


def anchor(cid: str) -> str:
    return "contract-" + cid


def _marked_ids(node: ast.AST, named: dict) -> list:
    """IDs of the zero3_contract marks in ``node`` (a decorator: direct, a module-level name, or in params)."""
    ids = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) == "zero3_contract":
            args = list(sub.args) + [k.value for k in sub.keywords if k.arg == "id"]
            if args and isinstance(args[0], ast.Constant):
                ids.append(args[0].value)
        elif isinstance(sub, ast.Name) and sub.id in named:
            ids.append(named[sub.id])
    return ids


def contract_tests() -> dict:
    """``{id: [(file, scenario or test name, docstring, every ID it carries)]}``: the decorated scenarios under
    ``fixtures/`` (``@contract``) and the marked tests of ``conformance/test_*.py`` (the batched families),
    each file relative to the checkout; ``{file: module docstring}`` under the key ``None``."""
    _imports()
    from pytest_zero3.fixtures import contract

    found: dict = {None: {}}
    for cid, scenarios in contract.scenarios(str(ROOT / "fixtures")).items():
        for sc in scenarios:
            file = "fixtures/" + sc.module.removeprefix(contract.PACKAGE + ".").replace(".", "/") + ".py"
            if file not in found[None]:
                found[None][file] = ast.get_docstring(ast.parse((ROOT / file).read_text())) or ""
            found.setdefault(cid, []).append((file, sc.function, sc.doc, [cid]))
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        file = f"conformance/{path.name}"
        named = {}  # NAME = pytest.mark.zero3_contract("ID") at module level
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                ids = _marked_ids(node.value, {})
                if len(ids) == 1:
                    named[node.targets[0].id] = ids[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            ids = sorted({i for d in node.decorator_list for i in _marked_ids(d, named)})
            for cid in ids:
                found[None][file] = ast.get_docstring(tree) or ""
                found.setdefault(cid, []).append((file, node.name, ast.get_docstring(node) or "", ids))
    return found


_ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|obj):`~?([^`]+)`")


def prose(doc: str) -> str:
    """A docstring as Markdown: paragraphs kept, lines of a paragraph joined (indentation in a docstring
    is layout, not code), list items on lines of their own, Sphinx roles reduced to code."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        items: list = []
        for line in para.splitlines():
            line = line.strip()
            if not line:
                continue
            if re.match(r"([*-]|\d+\.) ", line) or not items:
                items.append(line)
            else:
                items[-1] += " " + line
        text = "\n".join(items)
        text = _ROLE.sub(lambda m: "``" + m.group(1) + "``", text)
        if items and re.match(r"([*-]|\d+\.) ", items[0]):
            text = "\n" + text  # a list needs a blank line before it
        out.append(text)
    return "\n\n".join(out)


def contracts_page() -> str:
    contracts, tests = _contracts(), contract_tests()
    modules = tests.pop(None)
    families: dict = {}
    for c in contracts.values():
        families.setdefault(c.family, []).append(c)
    out = []
    for fam in sorted(families, key=_family_key):
        members = sorted(families[fam], key=lambda c: c.id)
        out += [f"### Family `{fam}`", ""]
        files = sorted({t[0] for c in members for t in tests.get(c.id, [])})
        for name in files:
            if modules.get(name):
                out += [f"From `{name}`:", "", prose(modules[name]), ""]
        shared = {}
        for c in members:
            out += [
                f"#### {c.id} {{ #{anchor(c.id)} }}",
                "",
                f"{_cell(c.statement)}",
                "",
                f"*Source:* {c.source}. *Ranks:* {_ranks(c)}.",
                "",
            ]
            for file, test, doc, ids in tests.get(c.id, []):
                kind = "Scenario" if file.startswith("fixtures/") else "Test"
                if len(ids) > 1:
                    shared[(file, test)] = (doc, ids)
                    out += [f"{kind}: `{file}::{test}` (judges {', '.join(ids)}; below).", ""]
                else:
                    out += [f"{kind}: `{file}::{test}`.", ""]
                    if doc:
                        out += [prose(doc), ""]
        for (file, test), (doc, ids) in shared.items():
            out += [f"#### `{test}`: {', '.join(ids)}", "", f"`{file}::{test}`.", ""]
            if doc:
                out += [prose(doc), ""]
    return "\n".join(out).rstrip() + "\n"


def _cases():
    _imports()
    from flags import CASES

    return CASES


def proof_table() -> str:
    lines = ["| coordinator | bug | flagged by |", "|---|---|---|"]
    for case in _cases():
        ids = ", ".join(sorted(case.flagged))
        if case.may_fail:
            ids += " (may also fail: " + ", ".join(sorted(case.may_fail - case.flagged)) + ")"
        lines.append(f"| `{case.name}` | {_cell(case.bug)} | {ids} |")
    return "\n".join(lines)


def options_table() -> str:
    _imports()
    from pytest_zero3 import options

    lines = ["| option | ini setting | default | meaning |", "|---|---|---|---|"]
    for opt in options.OPTIONS:
        flag = opt.flag if opt.switch else f"{opt.flag}={opt.metavar or '|'.join(opt.choices or ())}"
        default = ("on" if opt.default else "off") if opt.metavar == "on|off" else opt.default
        lines.append(f"| {_code(flag)} | `{opt.ini}` | {_default(default)} | {_cell(opt.help)} |")
    return "\n".join(lines)


def _default(value) -> str:
    if value in (None, ()):
        return "(none)"
    return f"`{','.join(value) if isinstance(value, tuple) else value}`"


def _expectations() -> dict:
    """``{release: {id: entry}}`` of every shipped expectations file, in release order."""
    _imports()
    from packaging.version import Version

    from pytest_zero3 import expectations
    from pytest_zero3._compat import tomllib

    found = {}
    for path in (ROOT / "conformance" / "expectations").glob("deepspeed-*.toml"):
        with open(path, "rb") as fh:
            table = tomllib.load(fh).get("expected_failures", {})
        loaded = expectations.load(path)
        found[path.stem.removeprefix("deepspeed-")] = {cid: _entry(e, loaded[cid]) for cid, e in table.items()}
    return dict(sorted(found.items(), key=lambda kv: Version(kv[0])))


def _entry(e, loaded) -> dict:
    """One ID's listing as a table; the array form (a cause per set of variants, profiles or config
    values) keeps its tables under ``"entries"`` and reads, as a whole, as the plugin reads it (``loaded``,
    the :class:`pytest_zero3.expectations.Expectation`): each table's tests, then its reason, in turn."""
    if isinstance(e, list):
        return {"reason": loaded.reason, "entries": e, "expectation": loaded}
    return {**e, "expectation": loaded} if isinstance(e, dict) else {"reason": e, "expectation": loaded}


def _listed(entry: dict) -> str:
    """A release's cell for a listed contract: "listed", naming the profiles of one listed under some only."""
    return f"listed ({', '.join(entry['profiles'])})" if entry.get("profiles") else "listed"


def expectations_page() -> str:
    files = _expectations()
    contracts = _contracts()
    releases = list(files)
    listed = sorted(
        {cid for entries in files.values() for cid in entries},
        key=lambda i: (_family_key(contracts[i].family) if i in contracts else (len(FAMILY_ORDER) + 1, ""), i),
    )
    out = [
        "| contract | " + " | ".join(f"**{v}**" for v in releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for cid in listed:
        cells = [_listed(files[v][cid]) if cid in files[v] else "" for v in releases]
        out.append(f"| [{cid}](../reference/contracts.md#{anchor(cid)}) | " + " | ".join(cells) + " |")
    out.append("| **listed** | " + " | ".join(str(len(files[v])) for v in releases) + " |")
    out.append("")
    for v in releases:
        out += [f"### deepspeed {v}", "", f"`conformance/expectations/deepspeed-{v}.toml`:", ""]
        out += ["| contract | reason | cause pinned |", "|---|---|---|"]
        for cid, whole in files[v].items():
            for e in whole.get("entries") or [whole]:
                pinned = (
                    "; ".join(f"{k} {_code(e[k])}" for k in ("raises", "match", "key") if e.get(k)) or "any failure"
                )
                if e.get("profiles"):
                    pinned += f"; under {', '.join(e['profiles'])} only"
                if e.get("variants"):
                    pinned += f"; variants {', '.join(e['variants'])} only"
                if e.get("when"):
                    pinned += (
                        "; where " + ", ".join(f"{k} = {_code(json.dumps(v))}" for k, v in e["when"].items()) + " only"
                    )
                out.append(f"| {cid} | {_cell(e.get('reason', ''))} | {pinned} |")
        out.append("")
    return "\n".join(out)


def bugs_page() -> str:
    """The entries whose reason names a new DeepSpeed bug, with the releases that list them."""
    files = _expectations()
    rows: dict = {}
    for v, entries in files.items():
        for cid, e in entries.items():
            if "new DeepSpeed bug" in e.get("reason", ""):
                rows.setdefault(cid, []).append(v)
    lines = ["| contract | listed as a new DeepSpeed bug in the expectations of |", "|---|---|"]
    for cid, releases in sorted(rows.items()):
        lines.append(f"| [{cid}](../reference/contracts.md#{anchor(cid)}) | {', '.join(releases)} |")
    return "\n".join(lines)


def impl_constants() -> dict:
    """``MIN_DEEPSPEED``, ``MIN_DEEPSPEED_REFERENCE`` and ``MATRIX_RELEASES`` of ``pytest_zero3/impl.py``,
    read from its syntax tree (the module itself imports the plugin's layers)."""
    tree = ast.parse((ROOT / "pytest_zero3" / "impl.py").read_text())
    wanted = ("MIN_DEEPSPEED", "MIN_DEEPSPEED_REFERENCE", "MATRIX_RELEASES")
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in wanted:
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def stock_release() -> str:
    """The release stock runs are measured on: the newest with an expectations file."""
    return list(_expectations())[-1]


def listed_under(release: str, profile: str | None = None) -> list:
    """IDs the release's expectations file lists for a run of ``profile`` (None: the default profile),
    in the manual's order, as the plugin reads the file (:meth:`pytest_zero3.expectations.Expectation.covers`:
    an entry with ``profiles`` applies under those only, one with ``when`` where the suite's config under
    the profile has those values, an array where one of its tables applies)."""
    _imports()
    from pytest_zero3.fixtures import profiles

    name = profile or profiles.DEFAULT
    config = functools.partial(profiles.suite_config, name, {}, 2)  # asked only by a when
    ids = [cid for cid, e in _expectations()[release].items() if e["expectation"].covers(name, None, config)]
    contracts = _contracts()
    return sorted(ids, key=lambda i: (_family_key(contracts[i].family) if i in contracts else (99, ""), i))


def _and(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def stock_failures() -> str:
    """One sentence: what stock fails by its expectations file, under the default profile and each other."""
    v = stock_release()
    default = listed_under(v)
    text = (
        f"Stock deepspeed {v} fails {len(default)} contracts under the default profile, each listed with its "
        f"cause in `conformance/expectations/deepspeed-{v}.toml`: {_and(default)}"
    )
    profiles = sorted({p for e in _expectations()[v].values() for p in e.get("profiles") or ()})
    extra = [
        f"under the `{p}` profile also {_and(i for i in listed_under(v, p) if i not in default)}" for p in profiles
    ]
    return text + ("; " + "; ".join(extra) if extra else "") + "."


MATRIX_PAGE = ROOT / "docs" / "results" / "release-matrix.md"


def matrix_columns() -> dict:
    """``{release: has results}`` for each column of the committed release-matrix table."""
    table = MATRIX_PAGE.read_text().split("<!-- release-matrix:start -->", 1)[1].split("<!-- release-matrix:end -->")[0]
    header = next(line for line in table.splitlines() if line.startswith("| contract |"))
    return {m.group(1): not m.group(2) for m in re.finditer(r"\*\*([\d.]+)\*\*(<br>not run)?", header)}


def matrix_releases() -> str:
    """Which releases the matrix runs, and which the table below has results for."""
    releases = impl_constants()["MATRIX_RELEASES"]
    columns = matrix_columns()
    measured = [v for v in releases if columns.get(v)]
    missing = [v for v in releases if not columns.get(v)]
    text = (
        f"The matrix runs {len(releases)} releases, {_and(releases)} (`MATRIX_RELEASES` in `pytest_zero3/impl.py`, "
        "`RELEASES` in `scripts/release-matrix.sh`), each with its expectations file and its `ds-X.Y.Z` tox env."
    )
    if missing:
        text += (
            f" The table has results for {_and(measured) or 'none of them'}; the script has not run "
            f"{_and(missing)} yet, so their columns say so: what their expectations files list (each file's "
            "header says how it was measured) is [below](#what-each-expectations-file-lists)."
        )
    return text


def fork_ci() -> str:
    """``examples/fork-ci.yml`` as it is, so the guide shows the workflow a fork copies."""
    return "```yaml\n" + (ROOT / "examples" / "fork-ci.yml").read_text().rstrip("\n") + "\n```"


PARTS = {
    "contracts": contracts_page,
    "registry": registry_table,
    "proofs": proof_table,
    "options": options_table,
    "expectations": expectations_page,
    "bugs": bugs_page,
    "stock-failures": stock_failures,
    "matrix-releases": matrix_releases,
    "fork-ci": fork_ci,
}


def fill(markdown: str) -> str:
    """``markdown`` with every ``<!-- gen:NAME -->`` line replaced by its part; an unknown NAME raises."""

    def part(m: re.Match) -> str:
        name = m.group(1)
        if name not in PARTS:
            raise KeyError(f"<!-- gen:{name} -->: no such generated part; known: {', '.join(PARTS)}")
        return PARTS[name]().rstrip("\n")

    return MARK.sub(part, markdown)


if __name__ == "__main__":  # python docs/gen.py NAME: print one part
    print(PARTS[sys.argv[1]]())
