"""The manual (docs/, built by `tox -e docs`) and the front page (README.md).

The generated parts of the manual come from their single sources (contracts.toml and the contracts'
test docstrings, tests/flags.py, the option table, the expectations files): they must render and cover
every entry of each.  The README stays a front page: at most 30 KB, every relative link to a file that
exists.  mkdocs itself is not needed here (`tox -e docs` checks links and anchors with --strict).

Cost: milliseconds; no world, no pytest session, no torch.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from conftest import ROOT
from pytest_zero3 import registry

DOCS = ROOT / "docs"
README_LIMIT = 30 * 1024
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("zero3_docs_gen", DOCS / "gen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pages() -> dict:
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in sorted(DOCS.rglob("*.md"))}


def test_every_contract_is_on_the_generated_pages(gen):
    """Why: the contract list was kept by hand beside contracts.toml and drifted; now the pages are
    made from it, so every registered ID, statement and test must come out of the generator."""
    contracts = registry.load()
    page = gen.contracts_page()
    table = gen.registry_table()
    tests = gen.contract_tests()
    for cid, c in contracts.items():
        assert f"#### {cid} {{ #{gen.anchor(cid)} }}" in page, f"{cid} has no section on the contracts page"
        assert c.statement.replace("|", "\\|") in page and f"| [{cid}](#{gen.anchor(cid)}) |" in table, cid
        assert tests.get(cid), f"{cid}: no test in conformance/test_*.py carries its marker"
        for file, test, _doc, _ids in tests[cid]:
            assert f"`conformance/{file}::{test}`" in page, (cid, test)
    # the docstrings themselves are on the page: one that says why (000-a's cites its issue)
    assert "Why: issue 7670." in page
    # and each family's module docstring
    assert "Contract family 000:" in page and "Contract family ``rule``" in page


def test_every_proof_case_is_in_the_generated_table(gen):
    """Why: the proof table is tests/flags.py rendered; a case missing from it is a proof nobody reads."""
    import flags

    table = gen.proof_table()
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines()[2:]}
    assert [c.name for c in flags.CASES] == list(rows), "one row per case, in the table's order"
    for case in flags.CASES:
        flagged = rows[case.name].split("|")[3]
        assert all(cid in flagged for cid in case.flagged), case.name


def test_every_page_part_is_known_and_every_part_is_on_a_page(gen):
    """Why: a page naming an unknown part would lose its text silently; a part no page asks for is
    generated for nobody.  Filled, every registered ID appears on the manual's pages."""
    text = pages()
    used = {name for body in text.values() for name in gen.MARK.findall(body)}
    assert used == set(gen.PARTS), f"unknown parts: {used - set(gen.PARTS)}; unused: {set(gen.PARTS) - used}"
    filled = "\n".join(gen.fill(body) for body in text.values())
    assert not gen.MARK.search(filled)
    missing = [cid for cid in registry.load() if not re.search(rf"(?<![\w-]){re.escape(cid)}(?![\w-])", filled)]
    assert not missing, f"contract IDs on no page of the manual: {missing}"
    with pytest.raises(KeyError, match="no such generated part"):
        gen.fill("<!-- gen:nope -->\n")


def test_options_table_covers_every_option(gen):
    """Why: the option table is generated from options.OPTIONS (tests/test_config.py checks that the
    prose below it describes each option too)."""
    from pytest_zero3 import options

    rows = gen.options_table().splitlines()[2:]
    assert len(rows) == len(options.OPTIONS)
    for opt, row in zip(options.OPTIONS, rows):
        assert row.startswith((f"| `{opt.flag}", f"| <code>{opt.flag}")) and f"| `{opt.ini}` |" in row, row


def test_expectations_are_on_the_release_matrix_page(gen):
    """Why: the shipped expectations files are what a fork's gate starts from; each entry is shown."""
    page = gen.expectations_page()
    for path in sorted((ROOT / "conformance" / "expectations").glob("deepspeed-*.toml")):
        release = path.stem.removeprefix("deepspeed-")
        assert f"### deepspeed {release}" in page and f"`conformance/expectations/{path.name}`" in page
    assert "| [rule-d](../reference/contracts.md#contract-rule-d) |" in gen.bugs_page()


def _relative_links(text: str):
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        yield target.split("#", 1)[0]


def test_readme_is_a_front_page():
    """Why: the README grew to 117 KB of diaries; the manual holds the detail, the README points to it."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes; move detail to docs/"
    for target in _relative_links(text):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
    for command in ("bash scripts/conformance.sh", "bash .ci/run", "tox -e docs"):
        assert command in text, command


def test_manual_links_point_to_files():
    """Why: a page moved or renamed leaves links behind (tox -e docs checks anchors too, with mkdocs)."""
    for name, text in pages().items():
        base = (DOCS / name).parent
        for target in _relative_links(text):
            assert (base / target).exists(), f"docs/{name} links to {target}, which does not exist"


def test_every_family_has_a_row_on_the_front_page_and_the_contracts_page():
    """Why: the family tables are written by hand (a sentence per family), so a new family must be
    added to both; this is the check that it was."""
    families = {c.family for c in registry.load(str(ROOT / "conformance" / "contracts.toml")).values()}
    for path in (ROOT / "README.md", DOCS / "reference" / "contracts.md"):
        rows = set(re.findall(r"^\| `([\w-]+)` \|", path.read_text(), re.M))
        assert families <= rows, f"{path.name}: no family row for {sorted(families - rows)}"
