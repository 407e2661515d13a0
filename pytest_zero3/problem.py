"""One problem a contract found, as a record: the text a person reads, and the key it is judged by.

A scenario's problems used to be lines only, and a line's key was its text with the numbers masked: the
first differing element's index, a count of bytes, anything the mask did not know stayed in the key,
and "step 2" and "step 3" of the same check could not be told from a value.  A :class:`Problem` is
still the line (a ``str``: every place that prints, merges or searches lines keeps working) and carries
beside it what was checked (``check``: what was compared, called or counted) and where (``where``:
variant, step, micro-step, event, module, param, rank, in that order of reading).  Its :attr:`key`
holds those and nothing measured, so the same problem has the same key on every run, on a fork and on
its baseline (``--zero3-baseline`` judges by key), whatever the values in its text.

Every scenario of the suite reports records (``tests/test_problem_records.py`` checks its source); a
plain line stays allowed (a scenario of a fork's own, a rank that failed for itself): its key is the
masked text (:func:`pytest_zero3.expectations.problem_key`).  Records pickle across the rank boundary by
value.
"""

from __future__ import annotations

from collections.abc import Iterable


class Problem(str):
    """A problem line with its key: ``Problem(text, check, where)``; ``where`` is ``(name, value)`` pairs."""

    check: str
    where: tuple[tuple[str, str], ...]

    def __new__(cls, text: str, check: str, where: Iterable[tuple[str, object]] = ()) -> Problem:
        self = super().__new__(cls, text)
        self.check = check
        self.where = tuple((str(k), str(v)) for k, v in where)
        return self

    def __reduce__(self):
        return (Problem, (str.__str__(self), self.check, self.where))

    @property
    def key(self) -> str:
        """``check`` then each place, e.g. ``value differs from the twin | what=reads | step=2 | param=0.weight``."""
        return " | ".join([self.check, *(f"{k}={v}" for k, v in self.where)])

    def relabelled(self, text: str, *where: tuple[str, object], first: bool = False) -> Problem:
        """The same problem under a new text (a prefix, a merged rank list), with ``where`` added after
        its places (before them with ``first``: the outer place, such as the assertion's subject)."""
        more = tuple((str(k), str(v)) for k, v in where)
        return Problem(text, self.check, more + self.where if first else self.where + more)

    def at(self, label: str) -> Problem:
        """The problem as read at ``label`` (a step, a phase): ``label: text``, ``at=label`` its first place."""
        return self.relabelled(f"{label}: {self}", ("at", label), first=True)


def record(text: str, check: str, **where: object) -> Problem:
    """A :class:`Problem` (for a scenario: ``problems.append(record(line, "loss vs the twin", step=2))``);
    places given as None are left out."""
    return Problem(text, check, [(k, v) for k, v in where.items() if v is not None])
