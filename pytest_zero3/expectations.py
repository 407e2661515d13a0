"""The expectations file: the contracts known to fail for one implementation, each with its reason and cause.

TOML, comments allowed::

    # deepspeed 0.19.8
    [expected_failures]
    "000-a" = { reason = "prefetch-skip retention (PR 9003)", match = "still gathered after .* released" }
    "001-b" = { reason = "stale release sets (PR 8883)", raises = "AssertionError" }
    "002-g" = "reason only: any failure of 002-g counts as this one"
    "005-c" = { reason = "bug 11", key = "is AVAILABLE, not partitioned \\| what=.* \\| at=second wrap " }
    "007-b" = { reason = "hpZ only (DeepSpeed issue 4901)", match = "already initialized", profiles = ["hpz"] }
    "008-a" = { reason = "offloaded reads", match = "safe_get_local_grad", variants = ["offload"] }
    "008-g" = [
        { reason = "issue 7352", match = "retain_graph window 0", variants = ["retain_graph"] },
        { reason = "bug 16", match = "coalesce window 1", variants = ["coalesce"] },
    ]

A listed contract becomes a pytest ``xfail`` at collection.  ``match`` (a regular expression, or a
list of them, each searched as ``pytest.raises(match=...)`` does) in a problem's text, ``key`` (the
same, in a problem's key: :func:`problem_key`, a record's check and places, none of its values) and
``raises`` (an exception type's name: the test's own exception or the one a rank raised) pin the
failure's cause.  **A known failure
explains only its own problems**: a failure is judged problem by problem (each line a scenario
reports, each rank that raised for itself: :func:`problems`), every problem must be explained by one
of the entry's patterns (a ``match`` pattern that finds its text, or a ``key`` pattern its key), and a failure with any problem no pattern explains is a new failure that
names the unexplained ones ("behind the known failure of 008-b: ...").  So an entry names each
consequence of its bug that the test shows (a list of patterns), never a blanket, and a second bug
behind the same ID fails the run.  The plain ``"ID" = "reason"`` form pins no
cause and expects any failure; prefer the table form, or a second, different bug behind the same ID
goes unseen.  ``profiles`` (config profile names, ``--zero3-profile``) lists the contract's tests under
those profiles only: a failure that only a profile's axis reaches is no expectation under the others,
where the contract passes.  ``when`` (a table of dotted DeepSpeed config keys and values, e.g.
``when = { "bf16.enabled" = true }``) lists them where the suite's config under the test's profile and
``--zero3-config`` has those values: a bug that a config key reaches is known under a profile and
under a fork's overlay alike, and nowhere else.  ``variants`` does the same for a contract test parametrised by
``variant``: a known failure of one variant leaves the others judged.  A contract whose variants fail
for different causes lists an array of such tables, each naming its variants (none in two): each
variant is held to its own cause, so one variant's known bug hides nothing in another.  A table of the
array may name its tests by ``profiles`` or ``when`` instead (a bug that a profile reaches, another that
a config key does); a test that two of them list is held to both causes, each problem to one of them.  A listed contract that passes is an "unexpected pass" (a failure under
``--zero3-strict``, pytest's strict xfail); an ID that matches no collected contract is a warning.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

import pytest
from _pytest.outcomes import Failed  # pytest.fail.Exception, named so type checkers see the class

from pytest_zero3 import world
from pytest_zero3._compat import tomllib
from pytest_zero3.outcome import first_failure, peer_gone
from pytest_zero3.problem import Problem

FORMS = (
    'one line per contract under [expected_failures]: "000-a" = { reason = "...", match = "regex" } '
    '(or key = "regex of the problem\'s key", raises = "ExceptionType"; profiles = ["hpz"] / variants = ["offload"] / when = {"bf16.enabled" = true} '
    "to list those tests only), "
    'an array of such tables each naming its variants, profiles or when, or "000-a" = "reason" to expect any failure'
)


@dataclasses.dataclass(frozen=True)
class Expectation:
    """Why one contract is known to fail, and which failure that is (no ``match``/``raises``: any)."""

    reason: str
    #: One pattern or several: each problem of the failure must be found by one of them (or of ``key``).
    match: str | tuple[str, ...] | None = None
    raises: str | None = None
    #: Who lists it: the expectations file, or a baseline that fails the contract too (pytest_zero3.baseline),
    #: whose entries expect any failure and are never strict (a fix on the candidate is an improvement).
    source: str = "--zero3-expect"
    #: The config profiles whose tests of the contract it lists (empty: every profile's).
    profiles: tuple[str, ...] = ()
    #: The variants (a contract test's ``variant`` parameter) it lists (empty: every variant's).
    variants: tuple[str, ...] = ()
    #: ``(dotted config key, value)`` pairs the suite's config must have for it to list a test (empty: any).
    when: tuple[tuple[str, object], ...] = ()
    #: The array form: one entry per set of variants, profiles or config values, each with its own cause
    #: (this entry's own reason/match/raises are then only their summary).
    per_variant: tuple[Expectation, ...] = ()
    #: Problem keys it explains (:func:`problem_key`), beside ``match``: a baseline's entry explains the
    #: problems the baseline has, by key, whatever their values.
    keys: frozenset[str] = frozenset()
    #: Patterns searched in a problem's key (:func:`problem_key`), beside ``match``'s in its text: the file's ``key``.
    key: tuple[str, ...] = ()

    def covers(self, profile: str, variant: str | None = None, config: Callable[[], dict] | None = None) -> bool:
        """Whether it lists the contract's test under config profile ``profile`` and of ``variant``."""
        return self.listing(profile, variant, config) is not None

    def listing(
        self, profile: str, variant: str | None = None, config: Callable[[], dict] | None = None
    ) -> Expectation | None:
        """The entry that lists the contract's test under ``profile`` and of ``variant`` (this one, or in
        the array form the one that lists it; where several do, one made of them all: :func:`_merged`),
        else None.  ``config()``: the suite's config under that profile and ``--zero3-config``, flattened
        to dotted keys (asked only by a ``when``)."""
        if self.per_variant:
            listing = [e for e in self.per_variant if e.covers(profile, variant, config)]
            return _merged(listing) if len(listing) > 1 else next(iter(listing), None)
        listed = (not self.profiles or profile in self.profiles) and (
            not self.variants or variant is None or variant in self.variants
        )
        if listed and self.when:
            flat = config() if config is not None else {}
            listed = all(key in flat and flat[key] == value for key, value in self.when)
        return self if listed else None

    def entries(self) -> tuple[Expectation, ...]:
        """Each entry with a cause of its own: the array form's, else this one."""
        return self.per_variant or (self,)

    @property
    def from_file(self) -> bool:
        return self.source == "--zero3-expect"

    @property
    def cause(self) -> str:
        """The expected cause in words, for messages and the report ("" when any failure is expected)."""
        if self.keys:
            return f"has only the {len(self.keys)} problem(s) it has on the baseline"
        parts = []
        if self.raises:
            parts.append(f"raises {self.raises}")
        found = ["matches " + " or ".join(repr(p) for p in self.patterns)] if self.patterns else []
        found += ["has a key matching " + " or ".join(repr(p) for p in self.key)] if self.key else []
        if found:
            parts.append(", or ".join(found))
        return " and ".join(parts)

    @property
    def patterns(self) -> tuple[str, ...]:
        """``match`` as a tuple (empty: any text)."""
        if self.match is None:
            return ()
        return (self.match,) if isinstance(self.match, str) else tuple(self.match)

    def explains(self, problem: str) -> bool:
        """Whether one problem is one this entry's cause covers: its key is one of ``keys`` or one a ``key``
        pattern finds, or its text one a ``match`` pattern finds (any problem, where the entry gives none)."""
        if not (self.keys or self.key or self.patterns):
            return True
        key = problem_key(problem)
        return (
            key in self.keys
            or any(re.search(p, key) is not None for p in self.key)
            or any(re.search(p, problem) is not None for p in self.patterns)
        )

    def unexplained(self, exc: BaseException) -> list[str]:
        """The problems of failure ``exc`` this entry does not explain: every one where ``exc`` is not of
        the listed type (``raises``), else those no pattern finds."""
        found = problems(exc)
        if self.raises and self.raises not in type_names(exc):
            return found
        return [p for p in found if not self.explains(p)]

    def matches(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the expected failure: of the listed type, and each of its problems explained."""
        return not self.unexplained(exc)


#: What a problem's key leaves out: measured values (decimals, exponents, element counts, addresses,
#: a peer's host and port).
#: Integers that say where (step 2, rank 1, micro-batch 0) stay in the key.
_VALUE_RE = r"\[[\d.:a-fA-F]+\]:\d+|0x[0-9a-fA-F]+|-?\d+\.\d*(?:e[-+]?\d+)?|-?\d+e[-+]?\d+|\b\d+ of \d+ elements\b|\bnan\b|\binf\b"
_VALUES = re.compile(_VALUE_RE)
_VALUE = "<value>"


def problem_key(problem: str) -> str:
    """A problem's stable key: a record's own (:class:`pytest_zero3.problem.Problem`: what was checked
    and where), else its text with the measured values left out (:data:`_VALUES`), and of a rank that
    failed for itself only its first line (a traceback's paths and line numbers differ between a fork
    and its upstream)."""
    if isinstance(problem, Problem):
        return problem.key
    if re.match(r"rank \d+: ", problem):
        problem = problem.splitlines()[0]
    return _VALUES.sub(_VALUE, problem)


def problems(exc: BaseException) -> list[str]:
    """The problems of one failure, each judged apart by an entry: a scenario's problem lines (the
    ``problems`` an assertion carries: ``fixtures/verdicts.assert_clean``, the rule family's
    violations), else each rank of a failed world that failed for itself (its message, traceback and
    output; a rank that only lost a peer, or that the harness stopped, is no problem of its own while
    another rank failed for itself), else the failure's whole text."""
    found = getattr(exc, "problems", None)
    if found:
        return [p if isinstance(p, str) else str(p) for p in found]
    outcomes = getattr(exc, "outcomes", None)
    if outcomes:
        failed = [o for o in outcomes if not o.ok and o.status != "stopped"]
        own = [o for o in failed if not peer_gone(o)]
        if own or failed:
            return [o.describe() for o in own or failed]
    return [str(exc)]


def type_names(exc: BaseException) -> set:
    """Names ``raises`` may give for ``exc``: its classes (bare and qualified) and, for a failed world,
    the exception types its ranks raised (a rank's message reads ``"Type: text"``)."""
    names = set()
    for cls in type(exc).__mro__:
        names |= {cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"}
    for outcome in getattr(exc, "outcomes", None) or ():
        if outcome.status == "raised" and outcome.message:
            names.add(outcome.message.split(":", 1)[0].strip())
    return names


def load(path) -> dict:
    """``{contract_id: Expectation}`` from ``path``; :class:`pytest.UsageError` if the file is unusable."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise pytest.UsageError(f"--zero3-expect={path}: no such file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise pytest.UsageError(f"--zero3-expect={path}: not valid TOML ({exc}). Write {FORMS}.") from None
    table = data.get("expected_failures")
    if not isinstance(table, dict):
        raise pytest.UsageError(f"--zero3-expect={path}: needs an [expected_failures] table: {FORMS}.")
    return {cid: _listed(path, cid, value) for cid, value in table.items()}


def _listed(path, cid: str, value) -> Expectation:
    """One ID's listing: a string, a table, or an array of tables that each name the tests they list
    (their variants, profiles or config values): a contract whose variants fail for different bugs, or
    one that a profile reaches one bug in and a config key another."""
    if not isinstance(value, list):
        return _entry(path, cid, value)
    entries = [_entry(path, cid, v) for v in value]
    seen: set = set()
    for e in entries:
        if not (e.variants or e.profiles or e.when):
            raise pytest.UsageError(
                f"--zero3-expect={path}: {cid!r} is an array of tables: give each its variants = [...], "
                "profiles = [...] or when = {...}."
            )
        if e.profiles or e.when:
            continue  # it lists its tests by profile or config: another entry may list one of them too
        again = seen & set(e.variants)
        if again:
            raise pytest.UsageError(f"--zero3-expect={path}: {cid!r} lists variant {sorted(again)[0]!r} twice.")
        seen |= set(e.variants)
    if not entries:
        raise pytest.UsageError(f"--zero3-expect={path}: {cid!r} is an empty array: {FORMS}.")
    return Expectation(
        "; ".join(f"{_scope(e)}: {e.reason}" for e in entries),
        variants=tuple(v for e in entries for v in e.variants) if all(e.variants for e in entries) else (),
        per_variant=tuple(entries),
    )


def _scope(entry: Expectation) -> str:
    """The tests an entry of the array form lists, in words (its variants, profiles, config values)."""
    parts = [", ".join(entry.variants)] if entry.variants else []
    parts += [f"under {', '.join(entry.profiles)}"] if entry.profiles else []
    parts += [", ".join(f"{k}={json.dumps(v)}" for k, v in entry.when)] if entry.when else []
    return "; ".join(parts)


def _merged(entries: list[Expectation]) -> Expectation:
    """The entries of the array form that all list one test, as one: each problem must be one of them
    explains (a profile's bug and a config key's, both reached by the test), of the type they all
    name where they name one."""
    blanket = [e for e in entries if not (e.keys or e.key or e.patterns)]
    if blanket:  # one of them expects any failure
        return blanket[0]
    raises = {e.raises for e in entries}
    return Expectation(
        "; ".join(e.reason for e in entries),
        tuple(p for e in entries for p in e.patterns) or None,
        raises.pop() if len(raises) == 1 else None,
        key=tuple(p for e in entries for p in e.key),
    )


def _entry(path, cid: str, value) -> Expectation:
    if isinstance(value, str):
        value = {"reason": value}
    if not isinstance(value, dict):
        raise pytest.UsageError(f"--zero3-expect={path}: {cid!r} must be a reason string or a table: {FORMS}.")
    unknown = sorted(set(value) - {"reason", "match", "key", "raises", "profiles", "variants", "when"})
    if unknown:
        raise pytest.UsageError(
            f"--zero3-expect={path}: {cid!r} has unknown keys {', '.join(unknown)}; "
            "it may give reason, match, key, raises, profiles, variants, when."
        )
    when = value.get("when", {})
    if not isinstance(when, dict) or not all(
        isinstance(k, str) and k and isinstance(v, (bool, int, float, str)) for k, v in when.items()
    ):
        raise pytest.UsageError(
            f"--zero3-expect={path}: {cid!r}'s when must be a table of dotted config keys and plain values, "
            'e.g. when = { "bf16.enabled" = true }.'
        )
    variants = value.get("variants", [])
    if not isinstance(variants, list) or not all(isinstance(v, str) and v for v in variants):
        raise pytest.UsageError(f"--zero3-expect={path}: {cid!r}'s variants must be a list of variant names.")
    reason = value.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(f"--zero3-expect={path}: give {cid!r} a non-empty reason string.")
    if "raises" in value and (not isinstance(value["raises"], str) or not value["raises"].strip()):
        raise pytest.UsageError(f"--zero3-expect={path}: {cid!r}'s raises must be a non-empty string.")
    match = _patterns(path, cid, value, "match")
    return Expectation(
        reason,
        value["match"] if isinstance(value.get("match"), str) else match,
        value.get("raises"),
        profiles=_profiles(path, cid, value),
        variants=tuple(variants),
        when=tuple(sorted(when.items())),
        key=_patterns(path, cid, value, "key") or (),
    )


def _patterns(path, cid: str, value: dict, field: str) -> tuple[str, ...] | None:
    """An entry's ``match`` or ``key``: one regular expression or a list of them (None where not given)."""
    if value.get(field) is None:
        return None
    given = value[field]
    patterns = [given] if isinstance(given, str) else given
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p.strip() for p in patterns):
        raise pytest.UsageError(
            f"--zero3-expect={path}: {cid!r}'s {field} must be a non-empty string or a list of them "
            "(one pattern per problem its cause brings)."
        )
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise pytest.UsageError(
                f"--zero3-expect={path}: {cid!r}'s {field} {pattern!r} is no regular expression ({exc})."
            ) from None
    return tuple(patterns)


def _profiles(path, cid: str, value: dict) -> tuple[str, ...]:
    if "profiles" not in value:
        return ()
    from pytest_zero3.fixtures import profiles  # lazy: the suite's package, loaded by a session that uses it

    names = value["profiles"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise pytest.UsageError(f"--zero3-expect={path}: {cid!r}'s profiles must be a non-empty list of names.")
    unknown = [n for n in names if n not in profiles.PROFILES]
    if unknown:
        raise pytest.UsageError(
            f"--zero3-expect={path}: {cid!r} names unknown profiles {', '.join(unknown)}; "
            f"choose from {', '.join(profiles.PROFILES)}."
        )
    return tuple(names)


class KnownFailure(Failed):
    """A listed contract failed for its listed cause; raised from that failure (``cause``), which
    pytest shows above it.

    The contract's ``xfail`` mark says ``raises=KnownFailure``, so pytest reports it XFAIL; under
    ``--runxfail`` it is a failure, shown with the original one.
    """

    def __init__(self, cid: str, expectation: Expectation, cause: BaseException):
        listed = f" ({expectation.cause})" if expectation.cause else " (any failure)"
        super().__init__(
            f"known failure {cid}: {expectation.reason}\nthe failure above is the one {expectation.source} lists{listed}",
            pytrace=False,
        )
        self.cause = cause


class CauseMismatch(Failed):
    """A listed contract failed, but not only for its listed cause: a new failure, raised from it
    (``cause``).  ``unexplained``: the failure's problems the entry does not explain (all of them where
    it explains none, or the failure is not of the listed type)."""

    def __init__(self, cid: str, expectation: Expectation, cause: BaseException, unexplained=None):
        self.unexplained = list(unexplained if unexplained is not None else expectation.unexplained(cause))
        every = problems(cause)
        #: How many problems the failure has, explained or not.
        self.judged = len(every)
        if self.behind:
            shown = "\n".join("  " + one_line(p) for p in self.unexplained[:SHOWN])
            more = f"\n  ... {len(self.unexplained) - SHOWN} more" if len(self.unexplained) > SHOWN else ""
            text = (
                f"behind the known failure of {cid} ({expectation.reason}): {len(self.unexplained)} of "
                f"{len(every)} problems are not explained by its entry in {expectation.source} (it {expectation.cause}):\n"
                f"{shown}{more}"
            )
        else:
            text = (
                f"{cid} is listed in {expectation.source} as failing because it {expectation.cause} "
                f"({expectation.reason}), but it failed for another cause (above): {headline(cause)}"
            )
        super().__init__(text, pytrace=False)
        self.cause = cause

    @property
    def behind(self) -> bool:
        """Whether the entry explains some of the failure's problems (the rest are behind it)."""
        return len(self.unexplained) < self.judged

    @property
    def first_unexplained(self) -> str:
        """The first problem the entry does not explain, on one line."""
        return one_line(self.unexplained[0]) if self.unexplained else ""


#: Unexplained problems a CauseMismatch shows before "... N more" (the JSON report lists them all).
SHOWN = 12


def one_line(problem: str) -> str:
    """A problem's text on one line: its lines joined, the indentation dropped."""
    return " ".join(line.strip() for line in problem.splitlines() if line.strip())


#: What is no failure of the contract: pytest's own skip/xfail/exit, an interrupt, a world that never formed.
def passes_through(exc: BaseException) -> bool:
    through = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception, KeyboardInterrupt, SystemExit)
    return isinstance(exc, (*through, world.WorldNotFormed))


def judge(cid: str, expectation: Expectation, exc: BaseException) -> BaseException | None:
    """What a listed contract's failure ``exc`` becomes: :class:`KnownFailure` for the listed cause,
    :class:`CauseMismatch` for another, None for what is no failure (see :func:`passes_through`)."""
    if passes_through(exc):
        return None
    unexplained = expectation.unexplained(exc)
    if not unexplained:
        return KnownFailure(cid, expectation, exc)
    return CauseMismatch(cid, expectation, exc, unexplained)


def headline(exc: BaseException) -> str:
    """One line naming the failure: a failed world's first real failure, else the exception's first line."""
    outcomes = getattr(exc, "outcomes", None)
    if outcomes:
        return first_failure(outcomes)
    return (pytest.ExceptionInfo.from_exception(exc).exconly().splitlines() or [""])[0]
