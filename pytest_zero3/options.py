"""Command-line options and ini settings of the ``zero3`` group, and their validation.

Every bad value is turned into a :class:`pytest.UsageError` at configure time, before collection and
before any world starts, with a message that names the fix.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Optional

import pytest

from pytest_zero3 import impl, spawner

DEFAULT_TIMEOUT = 180.0
DEFAULT_STARTUP_TIMEOUT = spawner.DEFAULT_STARTUP_TIMEOUT
#: Option dest -> default, for every option of the group (see :func:`asked`).
DEFAULTS = dict(
    zero3_impl="installed",
    zero3_world_size=2,
    zero3_backend="auto",
    zero3_timeout=DEFAULT_TIMEOUT,
    zero3_startup_timeout=DEFAULT_STARTUP_TIMEOUT,
    zero3_select=None,
    zero3_report=None,
    zero3_report_md=None,
    zero3_expect=None,
    zero3_strict=False,
    zero3_profile=None,
    zero3_config=None,
)


def add_options(parser) -> None:
    group = parser.getgroup("zero3", "ZeRO-3 conformance (pytest-zero3)")
    group.addoption(
        "--zero3-impl",
        default="installed",
        metavar="SPEC",
        help="Implementation under test: 'installed' (default), 'reference', a DeepSpeed checkout "
        "directory, or a coordinator class as 'module.path:Class' or 'path/to/file.py:Class'.",
    )
    group.addoption(
        "--zero3-world-size",
        type=int,
        default=2,
        metavar="N",
        help="Number of ranks in each scenario's world (default 2).",
    )
    group.addoption(
        "--zero3-backend",
        default="auto",
        choices=("auto", "gloo", "nccl"),
        help="torch.distributed backend: auto picks nccl when there are at least N GPUs, else gloo.",
    )
    group.addoption(
        "--zero3-timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"Seconds one scenario may run before its ranks are reported hung (default {DEFAULT_TIMEOUT:g}).",
    )
    group.addoption(
        "--zero3-startup-timeout",
        type=float,
        default=DEFAULT_STARTUP_TIMEOUT,
        metavar="SECONDS",
        help="Seconds the forkserver that preloads torch and deepspeed may take to become ready, "
        f"a budget of its own, never taken from a scenario's (default {DEFAULT_STARTUP_TIMEOUT:g}).",
    )
    group.addoption(
        "--zero3-select",
        default=None,
        metavar="IDS",
        help="Run only the contracts whose ID starts with one of these comma-separated prefixes (e.g. '000,001-a').",
    )
    group.addoption(
        "--zero3-report", default=None, metavar="PATH", help="Write the conformance results as JSON to PATH."
    )
    group.addoption(
        "--zero3-report-md",
        default=None,
        metavar="PATH",
        help="Write the conformance results as Markdown to PATH (for a CI job summary).",
    )
    group.addoption(
        "--zero3-expect",
        default=None,
        metavar="FILE",
        help="TOML file of contract IDs known to fail for this implementation, each with a reason.",
    )
    group.addoption(
        "--zero3-strict",
        action="store_true",
        default=False,
        help="Fail the run when a contract listed in --zero3-expect unexpectedly passes.",
    )
    group.addoption(
        "--zero3-examples",
        type=int,
        default=None,
        metavar="N",
        help="Generated examples per run of the rule family (default: its small CI budget).",
    )
    group.addoption(
        "--zero3-seed",
        type=int,
        default=None,
        metavar="S",
        help="Seed of the rule family's generated examples (default: a fixed derandomised one).",
    )
    group.addoption(
        "--zero3-shrink",
        type=int,
        default=6,
        metavar="N",
        help="Worlds the rule family may start to shrink a failing example (0: report it unshrunk).",
    )
    group.addoption(
        "--zero3-profile",
        default=None,
        metavar="NAME[,NAME]|all",
        help="Config profiles the contracts run under: fp32 (default), bf16-offload, hpz, zinit, compile, "
        "and the GPU-only fp16, qwz, qgz, deepcompile; 'all' runs every one (fixtures/profiles.py).",
    )
    group.addoption(
        "--zero3-config",
        default=None,
        metavar="FILE",
        help="A DeepSpeed config (JSON or YAML) overlaid onto every contract's config, except the keys "
        "the contract is about.",
    )


@dataclasses.dataclass
class Settings:
    """Every ``zero3`` option, validated: the one reader of the group's configuration."""

    spec: impl.Spec
    world_size: int
    backend: str  # "auto" until the first world resolves it
    timeout: float
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    select: tuple = ()  # contract ID prefixes; empty selects every contract
    report: Optional[str] = None  # JSON report path
    report_md: Optional[str] = None  # Markdown report path
    expect: Optional[str] = None  # expectations file
    strict: bool = False
    examples: Optional[int] = None  # rule family: generated examples (None: its default)
    seed: Optional[int] = None  # rule family: seed (None: derandomised)
    shrink: int = 6  # rule family: worlds a shrink may start
    resolved_backend: str = ""  # set when the first world starts
    profiles: tuple = ("fp32",)  # config profiles (fixtures/profiles.py)
    config_file: Optional[str] = None  # --zero3-config
    config_overlay: Optional[dict] = None  # its contents


def settings_from(config) -> Settings:
    """Validate the options; raise :class:`pytest.UsageError` naming the fix.  Changes nothing."""
    opt = config.getoption
    try:
        spec = impl.parse(opt("--zero3-impl"))
        impl.check_version(spec)
    except impl.SpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    size = opt("--zero3-world-size")
    if size < 1:
        raise pytest.UsageError(f"--zero3-world-size={size}: a world needs at least 1 rank.")
    timeout = opt("--zero3-timeout")
    if not timeout > 0:
        raise pytest.UsageError(f"--zero3-timeout={timeout:g}: give a positive number of seconds.")
    startup = opt("--zero3-startup-timeout")
    if not startup > 0:
        raise pytest.UsageError(f"--zero3-startup-timeout={startup:g}: give a positive number of seconds.")
    backend = opt("--zero3-backend")
    if backend == "nccl":
        gpus = gpu_count()
        if gpus < size:
            raise pytest.UsageError(
                f"--zero3-backend=nccl needs {size} GPUs for --zero3-world-size={size}, "
                f"found {gpus}. Use --zero3-backend=gloo (CPU) or a smaller world size."
            )
    select = tuple(p.strip() for p in (opt("--zero3-select") or "").split(",") if p.strip())
    from pytest_zero3.fixtures import profiles

    config_file = opt("--zero3-config")
    try:
        names = profiles.parse_names(opt("--zero3-profile"))
        overlay = profiles.load_config_file(config_file) if config_file else None
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return Settings(
        spec,
        size,
        backend,
        timeout,
        startup,
        select=select,
        report=opt("--zero3-report"),
        report_md=opt("--zero3-report-md"),
        expect=opt("--zero3-expect"),
        strict=bool(opt("--zero3-strict")),
        examples=opt("--zero3-examples"),
        seed=opt("--zero3-seed"),
        shrink=opt("--zero3-shrink"),
        profiles=names,
        config_file=config_file,
        config_overlay=overlay,
    )


def settings(config) -> Settings:
    """The session's validated settings (activating the session if needed): read options only here."""
    session = config.pluginmanager.get_plugin("zero3-session")
    session.activate()
    return session.settings


def asked(config, args=()) -> bool:
    """Whether the run asked for pytest-zero3: a ``--zero3-*`` option on the command line (or in
    addopts, given as ``args``), or, where pytest-xdist builds a worker's options without its command
    line, an option that differs from its default."""
    if any(str(a).startswith("--zero3-") for a in (*config.invocation_params.args, *args)):
        return True
    return any(getattr(config.option, dest, default) != default for dest, default in DEFAULTS.items())


def gpu_count() -> int:
    """GPUs visible to this process, counted without initialising CUDA here."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def resolve_backend(settings: Settings, size: int) -> str:
    """The backend for a world of ``size`` ranks (DS_ACCELERATOR must match: see :func:`accelerator`)."""
    backend = settings.backend
    if backend == "auto":
        backend = "nccl" if gpu_count() >= size else "gloo"
    settings.resolved_backend = backend
    return backend


def accelerator(backend: str) -> str:
    """The DS_ACCELERATOR value for a torch.distributed backend."""
    return "cuda" if backend == "nccl" else "cpu"
