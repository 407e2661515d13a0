"""Judge any engine: the rule model (``fixtures/rule/rules.py``) watching a ZeRO-3 engine you built yourself.

``pytest_zero3.judge(engine)`` attaches the event probe (``fixtures/rule/event_probe.py``) to the engine's
hooks and feeds each finished step to :class:`pytest_zero3.fixtures.rule.rules.Judge`, with the rule config
read from the engine's own ZeRO config.  Records are judged as they finish and then dropped, so a long
run keeps only its violations.

A *step* is what the coordinator's trace counts: one forward of the engine's root module with its
backward, if any (with gradient accumulation, one micro-batch; an eval forward is a step too).

Sampling (``every=N``): the rules are a state machine over the trace the coordinator records, so a
step cannot be judged alone.  Every step's hook events are recorded (module and params per event:
what moves the trace), but only the judged steps pay for the rest: a snapshot of every param's status
after each event and the all-gather counts.  A skipped step moves the model's trace state exactly as
the coordinator's (:meth:`~pytest_zero3.fixtures.rule.rules.Trace.follow`), so a judged step is judged
against the trace state it really starts from, never against a guess.  Judged: steps 0 and 1 (the
one that records the trace, the first on a complete trace), then every step whose number is a
multiple of N.

Attached to an engine that has already trained, the judge invalidates the coordinator's trace first:
the model cannot know a trace it did not see recorded, and a re-recorded trace costs one step's prefetch.

The fixtures package is imported where it is used, never at import: the plugin imports this module in
every pytest run, and the fixtures' engine and probe import torch and deepspeed.
"""

from __future__ import annotations

from typing import Any

#: Violations the exception's message lists; :attr:`EngineJudge.violations` has them all.
SHOWN = 20


class RuleViolations(AssertionError):
    """The judged steps broke ZeRO-3 residency rules; ``violations`` lists every one."""

    def __init__(self, message: str, violations: list):
        super().__init__(message)
        self.violations = violations


class JudgeError(Exception):
    """The engine cannot be judged (not ZeRO stage 3, or a config the rule model does not cover)."""


def rule_config(engine):
    """The :class:`~pytest_zero3.fixtures.rule.rules.Config` of ``engine``: its ZeRO config and its params."""
    from pytest_zero3.fixtures.rule import rules  # lazy: see the module docstring

    stage = engine.zero_optimization_stage()
    if stage != 3:
        raise JudgeError(
            f"pytest_zero3.judge needs a ZeRO stage-3 engine; this one runs stage {stage}. "
            'Set "zero_optimization": {"stage": 3} in its DeepSpeed config.'
        )
    return rules.engine_config(engine)


class EngineJudge:
    """What :func:`pytest_zero3.judge` returns: a context manager; :attr:`violations` as they are found."""

    def __init__(self, engine, every: int = 1, check: bool = True, config=None):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"pytest_zero3.judge(every={every!r}): every must be a whole number of steps, 1 or more")
        from pytest_zero3.fixtures.rule import rules  # lazy: see the module docstring

        self.engine, self.every, self.check = engine, every, check
        self.config = config if config is not None else rule_config(engine)
        self.violations: list[Any] = []
        self.steps_seen = 0
        self.steps_judged = 0
        self._run = rules.Judge(self.config)
        self._probe: Any = None

    def judged(self, step: int) -> bool:
        """Whether step ``step`` (0-based) is judged: steps 0 and 1, then every multiple of ``every``."""
        return step < 2 or step % self.every == 0

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return self._probe is not None

    def attach(self) -> EngineJudge:
        """Hook the probe in; call it between steps.  An engine that already ran a step has its trace
        invalidated (as a changed module order would), so coordinator and model record it afresh."""
        from pytest_zero3.fixtures import engine as eng  # lazy: see the module docstring
        from pytest_zero3.fixtures.rule.event_probe import EventProbe  # lazy: see the module docstring

        if self._probe is None:
            coordinator = eng.coordinator(self.engine)
            if not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()
            self._probe = EventProbe(self.engine, judged=self.judged, on_step=self._judge_step)
        return self

    def detach(self) -> None:
        """Unhook the probe and judge the last step; safe to call twice."""
        if self._probe is not None:
            probe, self._probe = self._probe, None
            probe.remove()
            probe.finish()

    def __enter__(self) -> EngineJudge:
        return self.attach()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.detach()
        if exc_type is None and self.check:
            self.assert_clean()

    def _judge_step(self, record) -> None:
        self.steps_seen += 1
        self.steps_judged += record.judged
        self.violations += self._run.step(record)

    # -- verdict ---------------------------------------------------------------------------------
    def report(self) -> str:
        """The violations for a person: how many, the first :data:`SHOWN`, and what each broken rule says."""
        from pytest_zero3.fixtures.rule import rules  # lazy: see the module docstring

        c = self.config
        head = (
            f"{self.steps_judged} of {self.steps_seen} steps judged (every={self.every}); rule config from the "
            f"engine: stage3_prefetch_bucket_size={c.prefetch_bucket}, stage3_max_live_parameters={c.max_live}, "
            f"stage3_max_reuse_distance={c.reuse_distance}, stage3_param_persistence_threshold="
            f"{c.persistence_threshold}"
        )
        if not self.violations:
            return f"no ZeRO-3 rule violation: {head}"
        lines = [f"{len(self.violations)} ZeRO-3 rule violations: {head}"]
        lines += [f"  {v}" for v in self.violations[:SHOWN]]
        if len(self.violations) > SHOWN:
            lines.append(f"  ... and {len(self.violations) - SHOWN} more (EngineJudge.violations has them all)")
        lines.append("The rules broken:")
        lines += [f"  {r}: {rules.RULES[r]}" for r in sorted({v.rule for v in self.violations})]
        return "\n".join(lines)

    def assert_clean(self) -> None:
        """Raise :class:`RuleViolations` (an ``AssertionError``) when any judged step broke a rule."""
        if self.violations:
            raise RuleViolations(self.report(), list(self.violations))


def judge(engine, every: int = 1, check: bool = True, config=None) -> EngineJudge:
    """Judge ``engine``'s ZeRO-3 coordinator against the rule model while it trains.

    ``with pytest_zero3.judge(engine, every=10) as j: <train>``: on a clean exit of the block,
    :class:`RuleViolations` lists every violation (rule, step, event, module, param), unless
    ``check=False``; ``j.violations`` holds them as :class:`pytest_zero3.fixtures.rule.rules.Violation`
    either way.  ``every``: judge steps 0 and 1, then every ``every``-th (module docstring: why that is
    sound).  ``config``: a :class:`pytest_zero3.fixtures.rule.rules.Config` instead of the engine's own.
    Without ``with``, call ``attach()`` and ``detach()``, then ``assert_clean()``.
    """
    return EngineJudge(engine, every=every, check=check, config=config)
