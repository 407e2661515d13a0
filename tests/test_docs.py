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
        assert tests.get(cid), f"{cid}: no scenario under fixtures/ and no test in conformance/test_*.py carries it"
        for file, test, _doc, _ids in tests[cid]:
            assert f"`{file}::{test}`" in page, (cid, test)
    # the docstrings themselves are on the page: one that says why (000-a's cites its issue)
    assert "Why: issue 7670." in page
    # and each scenario module's docstring
    assert "From `fixtures/reuse_window.py`:" in page and "Contract family ``rule``" in page


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


# --- Numbers from their sources -----------------------------------------------------------------------
# The counts the README and the manual state in prose (bugs found, what stock fails, the oldest deepspeed,
# the releases of the matrix) are read here from the files they come from, and every statement of one
# is compared with it: a stale number fails with the file, the line and the right number.

NUMBER_WORDS = dict(zip("one two three four five six seven eight nine ten eleven twelve".split(), range(1, 13)))
#: The pages whose prose is checked: the README and the manual, less the changelog (history, dated) and
#: the generated failure messages.
PROSE_SKIP = {"changelog.md", "release-matrix.md", "release-matrix-fw.md"}
VERSION = r"(\d+\.\d+\.\d+)"


def _prose_files():
    yield "README.md", (ROOT / "README.md").read_text()
    for name, text in pages().items():
        if name not in PROSE_SKIP:
            yield f"docs/{name}", text


def _number(word: str) -> str:
    """A number written as a word ("eight") as digits; anything else as it is."""
    return str(NUMBER_WORDS.get(word.lower(), word))


def new_bugs(gen) -> list:
    """The numbered bugs of docs/results/bugs.md's "New bugs, found by the suite", each as the contract
    IDs in the parenthesis after its title."""
    text = (DOCS / "results" / "bugs.md").read_text()
    section = text.split("## New bugs, found by the suite", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"^(\d+)\. (?=\*\*)", section, flags=re.M)[1:]
    numbers = [int(n) for n in items[::2]]
    assert numbers == list(range(1, len(numbers) + 1)), f"docs/results/bugs.md: the new bugs are numbered {numbers}"
    known = set(registry.load())
    bugs = []
    for n, body in zip(numbers, items[1::2]):
        m = re.match(r"\*\*.*?\*\*\s*\(([^)]*)\)", body, re.S)
        ids = [i for i in re.findall(r"(?<![\w-])([\w]+-[a-z])(?![\w-])", m.group(1) if m else "") if i in known]
        assert ids, f"docs/results/bugs.md: bug {n} names no contract in the parenthesis after its title"
        bugs.append(ids)
    return bugs


def _claims(gen):
    """(pattern, what the source says for a match, the source's name): each pattern's groups are the
    numbers a page states, compared as text with the tuple the function returns."""
    impl = gen.impl_constants()
    releases = impl["MATRIX_RELEASES"]
    bugs = new_bugs(gen)
    files = gen._expectations()

    def still_has(release):
        return sum(any(i in files.get(release, {}) for i in ids) for ids in bugs)

    def listed(release, profile=None):
        return len(gen.listed_under(release, profile)) if release in files else -1

    return [
        (
            rf"runs\s+on\s+deepspeed\s+{VERSION}\s+and\s+later",
            lambda m: (impl["MIN_DEEPSPEED"],),
            "pytest_zero3/impl.py MIN_DEEPSPEED",
        ),
        (
            rf"any\s+deepspeed\s+older\s+than\s+{VERSION}",
            lambda m: (impl["MIN_DEEPSPEED"],),
            "pytest_zero3/impl.py MIN_DEEPSPEED",
        ),
        (
            rf"need\s+deepspeed\s+{VERSION}\s+or\s+later",
            lambda m: (impl["MIN_DEEPSPEED_REFERENCE"],),
            "pytest_zero3/impl.py MIN_DEEPSPEED_REFERENCE",
        ),
        (
            rf"(?:bases|release\s+from)\s+{VERSION}\s+to\s+{VERSION}",
            lambda m: (releases[0], releases[-1]),
            "pytest_zero3/impl.py MATRIX_RELEASES",
        ),
        (
            r"\b(\w+)\s+new\s+(?:DeepSpeed\s+)?bugs\b",
            lambda m: (len(bugs),),
            "the numbered list of docs/results/bugs.md",
        ),
        (
            rf"fixes\s+the\s+(\w+)\s+that\s+{VERSION}\s+still\s+has",
            lambda m: (still_has(m.group(2)), m.group(2)),
            "the bugs of docs/results/bugs.md whose contract that release's expectations file lists",
        ),
        (
            rf"[Ss]tock\s+deepspeed\s+{VERSION}\s+fails\s+(\d+)\b",
            lambda m: (m.group(1), listed(m.group(1))),
            "that release's conformance/expectations file, entries for the default profile",
        ),
        (
            rf"deepspeed\s+{VERSION}\s+fails\s+\d+\s+\((\d+)\s+under\s+the\s+`([\w-]+)`\s+profile",
            lambda m: (m.group(1), listed(m.group(1), m.group(3)), m.group(3)),
            "that release's conformance/expectations file, entries for that profile",
        ),
        (
            r"\bbug\s+(\d+)\b",
            lambda m: (m.group(1) if 1 <= int(m.group(1)) <= len(bugs) else len(bugs),),
            "a bug of docs/results/bugs.md's numbered list",
        ),
    ]


def test_numbers_in_the_prose_are_their_sources(gen):
    """Why (issue 38): the README said six bugs in one place and eight in another, that stock 0.19.8
    fails 20 where its expectations file listed 25, and the numbers were typed by hand.  Every
    statement of such a count, on the README and the manual's pages, is compared with its source, and
    each kind of statement is made at least once (a reworded sentence must keep its check)."""
    wrong, unused = [], []
    for pattern, source, name in _claims(gen):
        found = 0
        for path, text in _prose_files():
            for m in re.finditer(pattern, text):
                stated = tuple(_number(g) for g in m.groups())
                want = tuple(str(x) for x in source(m))
                found += 1
                if stated != want:
                    line = text.count("\n", 0, m.start()) + 1
                    said = " ".join(m.group(0).split())
                    wrong.append(f"{path}:{line}: says {said!r}; the right values are {', '.join(want)} ({name})")
        if not found:
            unused.append(pattern)
    assert not wrong, "\n".join(wrong)
    assert not unused, f"no page states these any more (reword the check with the sentence): {unused}"


def test_the_release_matrix_pages_cover_every_release_of_the_matrix(gen):
    """Why (issue 38): the matrix grew to 0.14.5 and 0.15.4 (impl.py, the script, tox, expectations
    files) while the committed table kept its six columns.  Every release of the matrix is a column of
    the table and a section of the failure messages (one the script has not run says so), and the
    release lists agree: impl.MATRIX_RELEASES, the expectations files, the tox envs."""
    from pytest_zero3 import impl

    releases = list(impl.MATRIX_RELEASES)
    assert list(gen.impl_constants()["MATRIX_RELEASES"]) == releases
    assert list(gen._expectations()) == releases, "conformance/expectations/deepspeed-*.toml: one per release"
    tox = (ROOT / "tox.ini").read_text()
    envlist = re.search(r"^envlist\s*=\s*(.*)$", tox, re.M).group(1)
    assert [e.strip()[3:] for e in envlist.split(",") if e.strip().startswith("ds-")] == releases, "tox.ini envlist"
    assert re.findall(r"^\[testenv:ds-([\d.]+)\]", tox, re.M) == releases, "tox.ini: one [testenv:ds-X.Y.Z] each"
    columns = gen.matrix_columns()
    assert list(columns) == releases, (
        f"docs/results/release-matrix.md: the table's columns are {list(columns)}, the matrix's releases "
        f"{releases}: re-render it (scripts/render_matrix.py keeps the columns it has no report of)"
    )
    details = (DOCS / "release-matrix.md").read_text()
    sections = re.findall(r"^## deepspeed ([\d.]+)$", details, re.M)
    assert sections == releases, f"docs/release-matrix.md: sections for {sections}, releases {releases}"
    for v, measured in columns.items():
        body = details.split(f"## deepspeed {v}\n", 1)[1].split("\n## ", 1)[0]
        assert measured != body.lstrip().startswith("Not run:"), f"{v}: the table and the messages disagree"
    assert "<!-- gen:matrix-releases -->" in gen.MATRIX_PAGE.read_text()


def test_the_package_s_deepspeed_floor_is_the_plugin_s():
    """Why (issue 38): the manual says the plugin runs on deepspeed MIN_DEEPSPEED and later (impl.py
    checks it at start-up, and tox's ds-0.14.5 and ds-0.15.4 envs install those releases); a dependency
    that asks for more makes pip replace such a deepspeed, or refuse the install."""
    from packaging.requirements import Requirement

    from pytest_zero3 import impl
    from pytest_zero3._compat import tomllib

    with open(ROOT / "pyproject.toml", "rb") as fh:
        deps = [Requirement(d) for d in tomllib.load(fh)["project"]["dependencies"]]
    (ds,) = [d for d in deps if d.name == "deepspeed"]
    assert str(ds.specifier) == f">={impl.MIN_DEEPSPEED}", (
        f"pyproject.toml: {ds}; the plugin's floor: {impl.MIN_DEEPSPEED}"
    )


def test_the_latest_benchmark_is_of_the_suite_as_it_is(gen):
    """Why (issue 38): "the default suite, N contracts" and what stock fails there are counts too.  The
    latest figures of docs/results/benchmarks.md name the registry's count of contracts, each side's
    outcomes add up to it, and stock's known failures are what its expectations file lists for the
    default profile; a contract or an entry added since makes them stale: measure again."""
    text = (DOCS / "results" / "benchmarks.md").read_text()
    latest = text.split("**Latest", 1)[1].split("\n\n", 1)[0]
    m = re.search(
        rf"default suite, (\d+) contracts: the reference [^(]*\((\d+) pass, (\d+) unsupported\); stock {VERSION} with "
        r"its\s+expectations [^(]*\((\d+) pass, (\d+) known failures, (\d+) unsupported\)",
        latest,
    )
    assert m, "docs/results/benchmarks.md: the latest figures no longer state the default suite's outcomes"
    total, ref_pass, ref_unsup, release, st_pass, st_known, st_unsup = m.groups()
    line = text.count("\n", 0, text.index(m.group(0))) + 1
    where = f"docs/results/benchmarks.md:{line}"
    default = len([c for c in registry.load().values() if not c.opt_in])  # the default run leaves opt-in ones out
    assert int(total) == default, f"{where}: {total} contracts; contracts.toml has {default} outside opt-in families"
    assert int(ref_pass) + int(ref_unsup) == int(total), f"{where}: the reference's outcomes do not add up to {total}"
    assert int(st_pass) + int(st_known) + int(st_unsup) == int(total), f"{where}: stock's outcomes do not add up"
    listed = len(gen.listed_under(release))
    assert int(st_known) == listed, f"{where}: {st_known} known failures; deepspeed-{release}.toml lists {listed}"
