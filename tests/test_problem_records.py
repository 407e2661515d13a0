"""Every problem a scenario reports is a record (issue 53 item 1): a static check of the scenario modules.

A plain line still works (its key is its masked text), so nothing at run time fails when a scenario
appends one; the expectations and ``--zero3-baseline`` then judge it by its text with the numbers
masked, which keeps every other number in the key.  This reads the source of every module a contract
runs (``fixtures/``, less pytest's face ``fixtures/pytest_side``, and ``conformance/``) and fails on a
string put straight into a problem list: appended to, added to or assigned to a list whose name says
it holds problems, returned in a list, or given as a result's ``"problems"``; a local name last
assigned a string counts as one.  Milliseconds; no world, no torch.
"""

import ast

from conftest import ROOT

#: Names of the lists a scenario collects its problems in.
PROBLEM_LISTS = frozenset(
    {
        "problems",
        "out",
        "bad",
        "found",
        "lines",
        "refusals",
        "never",
        "missed",
        "whole",
        "within",
        "moved",
        "saved",
        "violations",
        "everything",
    }
)
#: Functions whose lists of strings are no problems (file, function): why.
NOT_PROBLEMS = {
    ("fixtures/twin.py", "unmodelled"): "config keys the twin does not model",
    ("fixtures/release_cache.py", "holder_chain"): "the referrers of a survivor, one text",
    ("fixtures/rule/examples.py", "reproducer"): "a reproducer's description",
    ("fixtures/rule/zero_keys.py", "render"): "the ZeRO keys' table",
    ("fixtures/parity.py", "emit"): "a log record captured (base-k judges them)",
    ("fixtures/parity.py", "trace_cache_warnings_one"): "the lines a run printed (base-k judges them)",
}


def _text(node, texts) -> bool:
    """Whether ``node`` is a string: a literal, an f-string, a sum or a slice of one, or a name in ``texts``."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    if isinstance(node, ast.Name):
        return node.id in texts
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _text(node.left, texts) or _text(node.right, texts)
    return isinstance(node, ast.Subscript) and _text(node.value, texts)


def _elements(node, texts) -> list:
    """The elements a list expression puts in a list, each with the names that are strings there."""
    if isinstance(node, ast.List):
        return [(e, texts) for e in node.elts]
    if isinstance(node, ast.ListComp):  # its own targets are not the function's strings
        bound = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        return [(node.elt, texts - bound)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _elements(node.left, texts) + _elements(node.right, texts)
    if isinstance(node, ast.IfExp):
        return _elements(node.body, texts) + _elements(node.orelse, texts)
    return []


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return node.slice.value if isinstance(node.slice, ast.Constant) else _name(node.value)
    return ""


def _body(function) -> list:
    """The nodes of ``function`` in source order, nested functions left to their own turn."""
    out = []

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out.append(child)
                walk(child)

    walk(function)
    return sorted(out, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


def plain_problems(source: str) -> list[tuple[int, str]]:
    """``(line, function)`` of each string a function of ``source`` puts straight into a problem list."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        texts: set = set()

        def plain(node) -> bool:
            return any(_text(e, t) for e, t in _elements(node, frozenset(texts)))  # noqa: B023 - read at once

        for node in _body(function):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if _name(t) in PROBLEM_LISTS and plain(node.value):
                        found.append((node.lineno, function.name))
                    if isinstance(t, ast.Name):
                        (texts.add if _text(node.value, texts) else texts.discard)(t.id)
            elif isinstance(node, ast.AugAssign) and _name(node.target) in PROBLEM_LISTS and plain(node.value):
                found.append((node.lineno, function.name))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend")
                and _name(node.func.value) in PROBLEM_LISTS
                and node.args
                and (_text(node.args[0], texts) if node.func.attr == "append" else plain(node.args[0]))
            ):
                found.append((node.lineno, function.name))
            elif isinstance(node, ast.Return) and node.value is not None and plain(node.value):
                found.append((node.lineno, function.name))
            elif isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "problems" and plain(v)
                for k, v in zip(node.keys, node.values)
            ):
                found.append((node.lineno, function.name))
    return found


def scenario_modules() -> list:
    modules = sorted((ROOT / "fixtures").rglob("*.py")) + sorted((ROOT / "conformance").glob("*.py"))
    return [p for p in modules if "pytest_side" not in p.parts]


def test_every_scenario_problem_is_a_record():
    """Why: a plain line is keyed by its masked text, so a key keeps what the mask does not know (an
    element index, a name list) and loses what it masks (a step that prints as a decimal): the
    baseline then calls a known problem new, or a new one known.  ``record(text, check, **where)``
    keys it by what was checked and where, whatever the values in its text."""
    plain = []
    for path in scenario_modules():
        rel = path.relative_to(ROOT).as_posix()
        plain += [
            f"{rel}:{line} ({function})"
            for line, function in plain_problems(path.read_text())
            if (rel, function) not in NOT_PROBLEMS
        ]
    assert not plain, (
        "a plain string put into a problem list; give it a key: record(text, check, **where) "
        "(pytest_zero3.problem; what was checked, and where: step, module, param), or, where the list "
        "holds no problems, list the function in NOT_PROBLEMS with why:\n  " + "\n  ".join(plain)
    )


def test_the_check_finds_plain_lines():
    """The check itself: each way a plain line reaches a problem list is found, and a record is not."""
    source = """
def scenario(step):
    problems = []
    problems.append(f"step {step}: kept")
    line = f"step {step}: kept"
    problems.append(line)
    problems += [f"step {s}: kept" for s in range(2)]
    ok = record(f"step {step}", "kept", step=step)
    problems.append(ok)
    problems += [record(f"step {s}", "kept", step=s) for s in range(2)]
    return {"problems": ["scenario precondition: nothing ran"]}

def check(found):
    return [f"{found}: differs"] if found else []
"""
    assert plain_problems(source) == [
        (4, "scenario"),
        (6, "scenario"),
        (7, "scenario"),
        (11, "scenario"),
        (14, "check"),
    ]


def test_an_entry_explains_by_key(tmp_path):
    """An expectations entry's ``key`` is searched in each problem's key: it pins what was checked and
    where, so another check under the same label (a read that gives None where values differed) is not
    its problem, whatever the text has in common."""
    import pytest

    from pytest_zero3 import expectations
    from pytest_zero3.problem import record

    path = tmp_path / "expect.toml"
    path.write_text(
        "[expected_failures]\n"
        '"008-a" = { reason = "bug 9", key = "^values differ from the twin\'s \\\\| at=offload, step \\\\d+ " }\n'
    )
    entry = expectations.load(path)["008-a"]
    at = "offload, step 1 micro-batch 0: gradient of up.weight"
    differs = record(
        f"{at}: 3 of 16 elements differ from the twin's; first at 5", "values differ from the twin's", at=at
    )
    none = record(f"{at}: safe_get_local_grad(up.weight) is None", "safe_get_local_grad is None", at=at)
    assert entry.explains(differs) and not entry.explains(none)
    assert not entry.explains(str(differs))  # a plain line's key is its masked text
    assert entry.cause.startswith("has a key matching ")
    path.write_text('[expected_failures]\n"008-a" = { reason = "bug 9", key = "(" }\n')
    with pytest.raises(pytest.UsageError, match="key '\\(' is no regular expression"):
        expectations.load(path)
