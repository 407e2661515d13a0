"""Per-rank outcomes of one scenario run and the failure text built from them.

A rank writes exactly one :class:`RankOutcome` (pickled) when its scenario returns or raises; a rank
that hangs or dies writes none, and the parent fills in what it observed (exit code, signal, the
faulthandler stack).  Everything here is plain data so it pickles across the process boundary.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
import time
from typing import Any


class Outcome(str, enum.Enum):
    """A contract's verdict in the report, read from the outcome pytest made.  The values are the
    report's stable JSON words."""

    PASS = "pass"
    FAIL = "fail"
    KNOWN_FAILURE = "known_failure"  # pytest's xfail: failed for the cause --zero3-expect lists
    UNEXPECTED_PASS = "unexpected_pass"  # pytest's xpass: passed, but --zero3-expect lists it as failing
    UNSUPPORTED = "unsupported"  # a skip raised as scenario.Unsupported: the implementation lacks a feature
    WORLD_ERROR = "world_error"  # the world did not form: no verdict on the contract, counted apart from FAIL
    SKIPPED = "skipped"
    NOT_RUN = "not_run"  # registered, selected, but no test of it ran (deselected by -k, interrupted)

    @property
    def label(self) -> str:
        """How the terminal and Markdown tables show it."""
        return {
            "fail": "FAIL",
            "known_failure": "known failure",
            "unexpected_pass": "unexpected pass",
            "not_run": "not run",
            "world_error": "world error",
        }.get(self.value, self.value)


#: Worst first: a contract row shows its worst test.
SEVERITY = (
    Outcome.FAIL,
    Outcome.WORLD_ERROR,
    Outcome.KNOWN_FAILURE,
    Outcome.UNEXPECTED_PASS,
    Outcome.UNSUPPORTED,
    Outcome.SKIPPED,
    Outcome.PASS,
    Outcome.NOT_RUN,
)

# A rank's status in one scenario run (also stable lowercase words in the report's "ranks").
PASSED = "passed"
RAISED = "raised"
SKIPPED = "skipped"
XFAILED = "xfailed"  # pytest.xfail() in the scenario
UNSUPPORTED = "unsupported"
HUNG = "hung"
DIED = "died"
STOPPED = "stopped"  # killed by the harness after another rank failed
UNFORMED = "unformed"  # could not join the process group: the scenario never started

#: What an error looks like when a rank raised only because a peer went away (it died, hung, or
#: closed its connections) or never came to a collective: a closed connection, a timed-out collective,
#: a broken rendezvous.  Never the cause while another rank died, hung or raised for itself, and no
#: verdict of its own while a peer left first with an ending of its own (:func:`explain`).
PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "gloo/transport",
    "connectfullmesh",
    "remote worker",
    "remote process exited",
    "distnetworkerror",
    "distbackenderror",
    "diststoreerror",
    "collective operation timeout",
    "could not join this scenario's process group",
)

#: The endings a rank chooses for itself that a peer's communication error may follow from without
#: being a failure of its own: the peer takes them (:func:`explain`).
_TAKEN = (UNSUPPORTED, SKIPPED, XFAILED)


class GroupNotFormed(Exception):
    """Launcher mode: the scenario's process group did not form in every try on some rank (every rank
    raises it, having agreed through the launcher's store), so the scenario never ran: ``UNFORMED``."""


@dataclasses.dataclass
class RankOutcome:
    rank: int
    status: str
    value: Any = None
    message: str = ""  # exception summary, skip/unsupported reason, or death cause
    traceback: str = ""  # formatted Python traceback (raised) or faulthandler stack (hung/died)
    log_tail: str = ""  # last lines the rank wrote to stdout/stderr
    identity: dict = dataclasses.field(default_factory=dict)  # what the rank ran: see impl.identity()
    #: When the rank ended (``time.time()``, stamped where the outcome is made: by the rank before it
    #: leaves, by the parent for a rank that died or was stopped): which rank left first.
    ended_at: float = dataclasses.field(default_factory=time.time)
    #: The rank whose ending this rank took (:func:`explain`): it failed only on a communication error
    #: after that peer left; its own error stays in ``traceback``.
    follows: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == PASSED

    def describe(self) -> str:
        head = f"rank {self.rank}: {self.status}"
        if self.follows is not None:
            head += f" (as rank {self.follows}, which it lost its connection to when that rank left)"
        if self.message:
            head += f": {self.message}"
        parts = [head]
        if self.traceback:
            parts.append(_indent(_trim_harness_frames(self.traceback).rstrip()))
        if self.log_tail and self.status not in (PASSED, SKIPPED):
            parts.append(_indent("--- rank output (tail) ---\n" + self.log_tail.rstrip()))
        return "\n".join(parts)


def death_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"exited with code {exitcode} before reporting a result"


def failure_text(outcomes: list[RankOutcome], title: str) -> str:
    """The text of a failed world: a one-line verdict per rank, then the details of each distinct failure,
    the likely cause first (see :func:`cause_rank`).

    Ranks that failed identically (as with :func:`pytest_zero3.scenario.agree`) are shown once.
    """
    lines = [title, ""]
    lines += [
        f"  rank {o.rank}: {o.status}"
        + (f": {o.message.splitlines()[0]}" if o.message else "")
        + left_first_note(outcomes, o)
        for o in outcomes
    ]
    lines.append("")
    groups: dict = {}
    for o in outcomes:
        if o.status != PASSED:
            groups.setdefault((o.status, o.message, _trim_harness_frames(o.traceback), o.log_tail), []).append(o)
    for same in sorted(groups.values(), key=lambda g: cause_rank(g[0])):
        text = same[0].describe()
        if len(same) > 1:
            ranks = ", ".join(str(o.rank) for o in same)
            text = text.replace(f"rank {same[0].rank}:", f"ranks {ranks}:", 1)
        lines += [text, ""]
    return "\n".join(lines).rstrip() + "\n"


def peer_gone(outcome: RankOutcome) -> bool:
    """Whether ``outcome`` is a rank that raised because a peer went away (see :data:`PEER_GONE`)."""
    text = f"{outcome.message}\n{outcome.traceback}".lower()
    return outcome.status == RAISED and any(p in text for p in PEER_GONE)


def first_to_leave(outcomes: list[RankOutcome], before: RankOutcome, endings=None) -> RankOutcome | None:
    """The peer of ``before`` that ended first, no later than ``before`` did, on an ending of its own
    (not a communication error, not stopped by the harness; one of ``endings`` where given); None where
    there is none."""
    peers = [
        o
        for o in outcomes
        if o.rank != before.rank
        and o.status != STOPPED
        and not peer_gone(o)
        and (endings is None or o.status in endings)
        and o.ended_at <= before.ended_at
    ]
    return min(peers, key=lambda o: o.ended_at, default=None)


def explain(outcomes: list[RankOutcome]) -> list[RankOutcome]:
    """The outcomes with each rank that failed only on a communication error after a peer left the
    world unsupported, skipped or as an expected failure taking that peer's outcome (``follows``).

    Such a rank was still in a collective, or still forming a group, with a peer that had decided,
    for itself, that the scenario ends here: under load the peer's exit reaches it as a closed
    connection.  Its error is the peer's decision, not a failure.  Where any rank failed for itself
    (raised, died, hung) nothing is taken: the world failed, and :func:`failure_text` names who left first.
    """
    own = {o.status for o in outcomes if not peer_gone(o) and o.status != STOPPED}
    if not own & set(_TAKEN) or not own <= {*_TAKEN, PASSED}:
        return outcomes
    settled = []
    for o in outcomes:
        peer = first_to_leave(outcomes, o, _TAKEN) if peer_gone(o) else None
        if peer is None:
            settled.append(o)
            continue
        settled.append(
            dataclasses.replace(
                o,
                status=peer.status,
                message=peer.message,
                traceback=f"{o.message}\n{o.traceback}",
                follows=peer.rank,
            )
        )
    return settled


def followers_note(outcomes: list[RankOutcome]) -> str:
    """What :func:`explain` did, in words ("" where it did nothing): for a verdict's reason."""
    taken = [o for o in outcomes if o.follows is not None]
    if not taken:
        return ""
    ranks = ", ".join(str(o.rank) for o in taken)
    leaders = ", ".join(sorted({str(o.follows) for o in taken}))
    return (
        f" [rank{'s' if len(taken) > 1 else ''} {ranks} failed only on a communication error after rank "
        f"{leaders} left with this outcome, and take{'' if len(taken) > 1 else 's'} it]"
    )


def left_first_note(outcomes: list[RankOutcome], o: RankOutcome) -> str:
    """For a rank that failed on a communication error: which peer left first, and how ("" where none did)."""
    if not peer_gone(o):
        return ""
    peer = first_to_leave(outcomes, o)
    if peer is None:
        return ""
    return f" (after rank {peer.rank} left first, {peer.status}, {o.ended_at - peer.ended_at:.1f} s before)"


def cause_rank(outcome: RankOutcome) -> int:
    """How likely ``outcome`` is the cause of a failed world, lower first: a rank that died, then one
    that raised for itself, then one that hung, then one that raised because a peer went away, then one
    that never joined; a rank the harness stopped, or that passed or skipped, is no cause."""
    if outcome.status == DIED:
        return 0
    if outcome.status == RAISED:
        return 3 if peer_gone(outcome) else 1
    return {HUNG: 2, UNFORMED: 4}.get(outcome.status, 5)


def first_failure(outcomes: list[RankOutcome]) -> str:
    """One line naming the failure that most likely caused the others (see :func:`cause_rank`)."""
    causes = sorted((o for o in outcomes if cause_rank(o) < 5), key=cause_rank)  # stable: rank order within a kind
    if not causes:
        return "scenario failed"
    o = causes[0]
    line = f"rank {o.rank} {o.status}: {o.message.splitlines()[0] if o.message else ''}".rstrip(": ")
    return line + left_first_note(outcomes, o)


_HARNESS_FRAMES = ("/multiprocessing/", "pytest_zero3/rank.py", 'File "<string>"')


def _trim_harness_frames(stack: str) -> str:
    """Drop the harness's own frames (rank bootstrap, multiprocessing) from a faulthandler stack."""
    lines = stack.splitlines()
    if lines and lines[0].startswith("Traceback"):
        return stack  # a Python traceback: the rank already left out its own frame
    return "\n".join(
        line for line in lines if not (line.lstrip().startswith("File ") and any(h in line for h in _HARNESS_FRAMES))
    )


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line for line in text.splitlines())
