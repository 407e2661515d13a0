"""The ``zero3`` options: one table that makes the command-line options, the ini settings, the
defaults and the frozen :class:`Settings`, the one reader of the group's configuration.

Every option is ``--zero3-NAME`` on the command line and ``zero3_NAME`` in ``[tool.pytest.ini_options]``,
``pytest.ini``, ``tox.ini`` or ``setup.cfg``; the command line wins over the ini file, which wins over
the table's default.  A relative path in an ini value is relative to the ini file's directory (a fork
writes ``zero3_impl = "."``), as pytest does for its own path settings.

Every bad value is a :class:`pytest.UsageError` (exit 4) that names the fix: a command-line value when
pytest parses its arguments, an ini value when the session activates, both before collection and
before any world starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from typing import Any, Callable, Literal, Protocol, cast

import pytest

from pytest_zero3 import accel, impl, registry, spawner

DEFAULT_TIMEOUT = 180.0
DEFAULT_STARTUP_TIMEOUT = spawner.DEFAULT_STARTUP_TIMEOUT


# -- value parsers: text (or a native TOML value) -> value; ValueError names the fix ----------------------
def _text(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise ValueError("give a value (leave the option out for its default)")
    return text


def _whole(minimum: int, what: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"give a whole number of {what}, not {value!r}") from None
        if number < minimum:
            raise ValueError(f"give at least {minimum} {what}, not {number}")
        return number

    return parse


def _world_size(value: Any) -> int:
    number = _whole(0, "ranks")(value)
    if number < 1:
        raise ValueError(f"a world needs at least 1 rank, not {number}")
    return number


#: ``--zero3-seed=date``: the seed is today's UTC date as YYYYMMDD, so a nightly run draws anew each day
#: and every day's draw replays with the number the run prints (``--zero3-seed=20261206``).
DATE_SEED = "date"


def _seed(value: Any) -> int:
    text = str(value).strip()
    if text == DATE_SEED:
        import datetime

        return int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d"))
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"give a whole number as the seed, or {DATE_SEED!r} (today's, YYYYMMDD), not {value!r}"
        ) from None


def _seconds(value: Any) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ValueError(f"give a positive number of seconds, not {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"give a finite number of seconds, not {value!r}: a hang must be reported in the end")
    if number <= 0:
        raise ValueError(f"give a positive number of seconds, not {value!r}")
    return number


def _backend(value: Any) -> str:
    return accel.check_backend(_text(value))


def _prefixes(value: Any) -> tuple[str, ...]:
    entries = [p.strip() for p in str(value).split(",")]
    if not any(entries) or not all(entries):
        raise ValueError(
            f"give comma-separated contract IDs or prefixes with no empty entry, e.g. '000,001-a', not {value!r}"
        )
    return tuple(entries)


def _replay(value: Any) -> tuple:
    """The examples of ``--zero3-replay``, checked before any world starts: the seq family's, or else the
    rule family's (imports their libraries)."""
    # lazy: the suite's package, loaded by a session that uses it
    from pytest_zero3.fixtures.pytest_side import rule_replay
    from pytest_zero3.fixtures.seq import space

    return space.load_replay(str(value)) or rule_replay.load_replay(str(value))


def _profiles(value: Any) -> tuple[str, ...]:
    from pytest_zero3.fixtures.pytest_side import (
        profile_options,  # lazy: the suite's package, loaded by a session that uses it
    )

    return profile_options.parse_names(str(value))


def _flag(value: Any) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"give true or false, not {value!r}")


def _on_off(flag: str) -> Callable[[Any], bool]:
    """``on``/``off`` (true/false and kin too, as an ini file writes them) for ``flag``; the error names
    the fix, since a bare flag before a path takes the path as its value."""

    def parse(value: Any) -> bool:
        try:
            return _flag(value)
        except ValueError:
            raise ValueError(
                f"give on or off, not {value!r} ({flag}=off turns it off; a bare {flag} takes the next "
                f"argument as its value: write {flag}=on before a path)"
            ) from None

    return parse


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``--zero3-NAME``, ini ``zero3_NAME``, :class:`Settings` field ``NAME``."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a command-line flag with no value (true/false in an ini file)
    bare: Any = None  # the value of the flag given without one (its value is optional), e.g. True
    path: bool = False  # a relative ini value is relative to the ini file's directory
    ini_type: Literal["string", "int", "float", "bool"] = (
        "string"  # the native TOML type under pytest's own [tool.pytest] table
    )

    @property
    def flag(self) -> str:
        return "--zero3-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "zero3_" + self.name


OPTIONS: tuple[Option, ...] = (
    Option(
        "impl",
        _text,
        "installed",
        "Implementation under test: 'installed' (default), 'reference', a DeepSpeed checkout "
        "directory, or a coordinator class as 'module.path:Class' or 'path/to/file.py:Class'.",
        metavar="SPEC",
        path=True,
    ),
    Option(
        "baseline",
        _text,
        None,
        "Judge the implementation against a baseline (same SPEC forms as --zero3-impl, e.g. 'installed' "
        "or an upstream checkout): the same contracts run on it first; a contract failing there too is "
        "an expected failure, so only a regression (passes on the baseline, fails here) fails the run.",
        metavar="SPEC",
        path=True,
    ),
    Option(
        "world_size",
        _world_size,
        2,
        "Number of ranks in each scenario's world (default 2).",
        metavar="N",
        ini_type="int",
    ),
    Option(
        "backend",
        _backend,
        "auto",
        "torch.distributed backend: 'auto' (default) takes the communication backend of DeepSpeed's "
        "accelerator (DS_ACCELERATOR, else DeepSpeed's detection; CUDA where N GPUs are visible, the CPU "
        "where fewer), or any backend's name: gloo, nccl, ccl, xccl, hccl, mpi...",
        metavar="NAME",
    ),
    Option(
        "timeout",
        _seconds,
        DEFAULT_TIMEOUT,
        f"Seconds one scenario may run before its ranks are reported hung (default {DEFAULT_TIMEOUT:g}).",
        metavar="SECONDS",
        ini_type="float",
    ),
    Option(
        "startup_timeout",
        _seconds,
        DEFAULT_STARTUP_TIMEOUT,
        "Seconds the forkserver that preloads torch and deepspeed may take to become ready, "
        f"a budget of its own, never taken from a scenario's (default {DEFAULT_STARTUP_TIMEOUT:g}).",
        metavar="SECONDS",
        ini_type="float",
    ),
    Option(
        "select",
        _prefixes,
        (),
        "Run only the contracts whose ID starts with one of these comma-separated prefixes (e.g. '000,001-a').",
        metavar="IDS",
    ),
    Option("report", _text, None, "Write the conformance results as JSON to PATH.", metavar="PATH", path=True),
    Option(
        "report_md",
        _text,
        None,
        "Write the conformance results as Markdown to PATH (for a CI job summary).",
        metavar="PATH",
        path=True,
    ),
    Option(
        "expect",
        _text,
        None,
        "TOML file of contract IDs known to fail for this implementation, each with a reason.",
        metavar="FILE",
        path=True,
    ),
    Option(
        "strict",
        _flag,
        False,
        "Fail the run when a contract listed in --zero3-expect unexpectedly passes.",
        switch=True,
        ini_type="bool",
    ),
    Option(
        "poison",
        _on_off("--zero3-poison"),
        True,
        "Fill the memory torch leaves uninitialised with NaN (integers with their largest value) in every "
        "rank, and an async gloo all-gather's output until its own handle is waited on, so a bug that "
        "reads padding, an unwritten buffer or an unfinished gather fails every run, not by luck: on "
        "(default) or off.",
        metavar="on|off",
        bare=True,
        ini_type="bool",
    ),
    Option(
        "examples",
        _whole(0, "examples"),
        None,
        "Generated examples per run of the rule and seq families (default: their small CI budgets).",
        metavar="N",
        ini_type="int",
    ),
    Option(
        "seed",
        _seed,
        None,
        "Seed of the rule and seq families' generated examples (default: a fixed derandomised one); "
        "'date': today's UTC date as YYYYMMDD, a new draw each day that replays by its number.",
        metavar="S|date",
        ini_type="string",
    ),
    Option(
        "shrink",
        _whole(0, "worlds"),
        6,
        "Worlds the rule and seq families may start to shrink a failing example (0: report it unshrunk).",
        metavar="N",
        ini_type="int",
    ),
    Option(
        "replay",
        _replay,
        None,
        "Run the rule or seq family on these examples only: the file a failing rule or seq test saved "
        "(its failure prints the command), or an example's JSON.",
        metavar="FILE|JSON",
    ),
    Option(
        "profile",
        _profiles,
        ("fp32",),
        "Config profiles the contracts run under: fp32 (default), bf16-offload, hpz, zinit, compile, "
        "and the GPU-only fp16, qwz, qgz, deepcompile; 'all' runs every one (fixtures/profiles.py).",
        metavar="NAME[,NAME]|all",
    ),
    Option(
        "config",
        _text,
        None,
        "A DeepSpeed config (JSON or YAML) overlaid onto every contract's config, except the keys "
        "the contract is about; draw:SEED overlays the fork config drawn from SEED (fixtures/pytest_side/overlays.py). "
        "One world first builds one engine under it: a config the implementation refuses at initialize "
        "is a usage error naming the key and the implementation's words.",
        metavar="FILE|draw:SEED",
        path=True,
    ),
)


def add_options(parser: pytest.Parser) -> None:
    """Register every option of :data:`OPTIONS` on the command line and in the ini file."""
    group = parser.getgroup("zero3", "ZeRO-3 conformance (pytest-zero3)")
    # Native TOML types exist in pytest's own [tool.pytest] table (pytest 9); elsewhere ini values are text.
    typed = pytest.version_tuple >= (9,)
    for opt in OPTIONS:
        if opt.switch:
            group.addoption(opt.flag, dest=opt.ini, action="store_true", default=None, help=opt.help)
        elif opt.bare is not None:
            group.addoption(
                opt.flag,
                dest=opt.ini,
                nargs="?",
                const=opt.bare,
                type=_argparse_type(opt),
                default=None,
                metavar=opt.metavar,
                help=opt.help,
            )
        else:
            group.addoption(
                opt.flag,
                dest=opt.ini,
                type=_argparse_type(opt),
                default=None,  # None: not given, so the ini value or the table's default applies
                metavar=opt.metavar,
                choices=opt.choices,
                help=opt.help,
            )
        # default=None: unset reads as None (not 0 or False), so the table's default applies.
        # A named Literal, not an inline conditional: mypy 2.4 reads a bare string in pytest 9.2's
        # addini(type=...) as a possible type form (maybe-unrecognized-str-typeform).
        ini_type: Literal["string", "int", "float", "bool"] = opt.ini_type if typed else "string"
        parser.addini(opt.ini, f"{opt.help} (command line: {opt.flag})", type=ini_type, default=None)


def _argparse_type(opt: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return opt.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = opt.metavar or opt.name
    return parse


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every ``zero3`` option, validated: the one reader of the group's configuration.  Built only by
    :func:`settings_from`; the defaults are the table's."""

    spec: impl.Spec  # the parsed ``impl`` option
    baseline: impl.Spec | None  # the parsed ``baseline`` option: what the verdict compares against
    world_size: int
    backend: str  # as configured; "auto" is resolved in the ranks (accel.backend)
    timeout: float
    startup_timeout: float
    select: tuple[str, ...]  # contract ID prefixes; empty selects every contract
    report: str | None  # JSON report path
    report_md: str | None  # Markdown report path
    expect: str | None  # expectations file
    strict: bool
    poison: bool  # uninitialised memory filled with NaN in every rank (fixtures/profiles.py)
    examples: int | None  # rule family: generated examples (None: its default)
    seed: int | None  # rule family: seed (None: derandomised)
    shrink: int  # rule family: worlds a shrink may start
    replay: tuple | None  # rule family: the examples to run instead of anchors + drawn ones
    profile: tuple[str, ...]  # config profiles (fixtures/profiles.py)
    config: str | None  # a DeepSpeed config file overlaid onto every contract's config


def _configured(config: pytest.Config, opt: Option) -> tuple[Any, str]:
    """``(value, where)``: the command line's value, else the ini file's (paths made absolute), else the
    default.  ``where`` names the source for error messages."""
    given = getattr(config.option, opt.ini, None)
    if given is not None:
        return given, opt.flag
    inifile = config.inipath.name if config.inipath else "the ini file"
    where = f"{opt.ini} in {inifile}"
    try:
        raw = config.getini(opt.ini)
    except (TypeError, ValueError) as exc:  # a native TOML value of the wrong type
        raise pytest.UsageError(f"{where}: {exc}") from None
    if raw is None or isinstance(raw, (str, list)) and not raw:  # unset (older pytest: "" or [])
        return opt.default, opt.flag
    try:
        value = opt.parse(raw)
    except ValueError as exc:
        raise pytest.UsageError(f"{where} = {raw!r}: {exc}.") from None
    if opt.path:
        base = str(config.inipath.parent if config.inipath else config.invocation_params.dir)
        if opt.name in ("impl", "baseline"):
            value = _spec_from(base, value)
        elif not value.startswith("draw:"):  # --zero3-config=draw:SEED names a drawn overlay, not a file
            value = os.path.join(base, value)
    return value, where


def _spec_from(base: str, text: str) -> str:
    """An ``impl`` or ``baseline`` value of an ini file, its paths made absolute against the ini file's directory."""
    if text in ("installed", "reference"):
        return text
    if ":" in text and not os.path.isdir(os.path.join(base, text)):
        module, _, cls_name = text.rpartition(":")
        return f"{os.path.normpath(os.path.join(base, module))}:{cls_name}" if module.endswith(".py") else text
    return os.path.normpath(os.path.join(base, text))


def settings_from(config: pytest.Config) -> Settings:
    """Validate the options; raise :class:`pytest.UsageError` naming the fix.  Changes nothing."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for opt in OPTIONS:
        values[opt.name], where[opt.name] = _configured(config, opt)
    spec = _spec("impl", values.pop("impl"), where["impl"])
    text = values.pop("baseline")
    baseline = _spec("baseline", text, where["baseline"]) if text is not None else None
    settings = Settings(spec, baseline=baseline, **values)
    try:
        accel.check(settings.backend, settings.world_size)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if settings.config:
        from pytest_zero3.fixtures.pytest_side import (
            profile_options,  # lazy: the suite's package, loaded by a session that uses it
        )

        try:
            profile_options.load_config_file(settings.config)
        except ValueError as exc:
            raise pytest.UsageError(f"{exc} (set by {where['config']})") from None
    return settings


def _spec(name: str, text: str, where: str) -> impl.Spec:
    """The implementation SPEC of option ``name`` (impl, baseline), parsed and checked; else a usage error."""
    option = f"--zero3-{name}"
    try:
        spec = impl.parse(text, option=option)
        impl.check_version(spec, option=option)
    except impl.SpecError as exc:
        raise pytest.UsageError(str(exc) + ("" if where.startswith("--") else f" (set by {where})")) from None
    return spec


class _Session(Protocol):
    """What :func:`settings` needs of the plugin's session object (:class:`pytest_zero3.plugin.Zero3Session`,
    registered under that name), which sits above this module."""

    def activate(self) -> Settings: ...


def settings(config: pytest.Config) -> Settings:
    """The session's validated settings (activating the session if needed): read options only here."""
    session = cast(_Session, config.pluginmanager.get_plugin("zero3-session"))
    return session.activate()


def asked(config: pytest.Config, args=()) -> bool:
    """Whether the run asked for pytest-zero3 on its command line (ini settings alone do not: a fork's
    own tests stay untouched): a ``--zero3-*`` option or the suite itself named in the arguments (or in
    addopts, given as ``args``), or, where pytest-xdist builds a worker's options without its command
    line, an option that was given."""
    if names_suite([*config.invocation_params.args, *args]):
        return True
    return any(getattr(config.option, opt.ini, None) is not None for opt in OPTIONS)


def suite_dir() -> str:
    """The conformance suite's directory, resolved (what a test path that names the suite resolves to)."""
    return os.path.dirname(os.path.realpath(registry.path()))


def names_suite(args) -> bool:
    """Whether ``args`` hold a ``--zero3-*`` option or name the conformance suite (``zero3-conformance``,
    ``pytest --pyargs pytest_zero3.conformance``, ``pytest conformance/``)."""
    args = [str(a) for a in args]
    if any(a.startswith("--zero3-") for a in args):
        return True
    if "--pyargs" in args and any(a.split("::")[0].startswith("pytest_zero3.conformance") for a in args):
        return True
    suite = suite_dir()
    for a in args:
        if a.startswith("-"):
            continue
        path = os.path.realpath(a.split("::")[0])
        if path == suite or path.startswith(suite + os.sep):
            return True
    return False
