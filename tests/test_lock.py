"""The lock (constraints.txt) covers what CI installs: a package CI pulls in that the lock does not
pin would float, and a new release of it could turn CI red on a commit that did not change."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# Pinned where they are installed (scripts/install.sh, tox.ini): the CPU wheel of torch, and the
# deepspeed of each release-matrix env.
PINNED_ELSEWHERE = {"torch", "deepspeed"}


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def _closure(extras: set[str]) -> set[str]:
    """Every distribution pytest-zero3 with these extras requires, transitively, as installed here."""
    seen: set[str] = set()
    todo = [(canonicalize_name("pytest-zero3"), frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            dep = canonicalize_name(req.name)
            try:
                metadata.version(dep)
            except metadata.PackageNotFoundError:
                continue  # not installed here (an extra of a dependency nobody asked for)
            todo.append((dep, frozenset(req.extras)))
    return seen - {canonicalize_name("pytest-zero3")}


def test_the_lock_pins_every_package_the_test_install_pulls_in():
    pins = _lock()
    missing = sorted(_closure({"test"}) - set(pins) - PINNED_ELSEWHERE)
    assert not missing, f"not in constraints.txt (run scripts/lock.sh): {missing}"


def test_the_install_matches_the_lock():
    """What scripts/install.sh installed is what the lock says (it installs with -c constraints.txt)."""
    pins = _lock()
    off = {
        name: (metadata.version(name), pins[name])
        for name in _closure({"test"}) & set(pins)
        if metadata.version(name) != pins[name]
    }
    assert not off, f"installed != locked (installed, locked): {off}; run scripts/install.sh"


def test_the_install_scripts_and_tox_use_the_lock():
    assert "-c constraints.txt" in (ROOT / "scripts" / "install.sh").read_text()
    tox = (ROOT / "tox.ini").read_text()
    locked_envs = re.findall(r"^deps =\n    -c\{toxinidir\}/constraints.txt$", tox, re.M)
    assert len(locked_envs) == len(re.findall(r"^deps =$", tox, re.M)) - 1, (
        "every tox env but latest installs under the lock"
    )
