"""Simulated DeepSpeed forks: a copy of the installed deepspeed package, optionally with one file changed."""

import os
import shutil


def copy_installed_deepspeed(dest):
    """Copy the installed ``deepspeed`` package to ``dest/deepspeed``; return ``dest``."""
    import importlib.util

    src = os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    shutil.copytree(src, os.path.join(dest, "deepspeed"), ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def edit(fork_dir, relpath, old, new):
    """Replace ``old`` (which must occur) with ``new`` in one file of the fork."""
    path = os.path.join(fork_dir, "deepspeed", relpath)
    text = open(path).read()
    assert old in text, f"{relpath} no longer contains {old!r}: update this simulated fork"
    with open(path, "w") as fh:
        fh.write(text.replace(old, new))


class ForkCache:
    """``forks(name)``: a copy of the installed deepspeed with ``edits[name] = (relpath, old, new)``
    applied, built once per cache (a module-scoped fixture holds one)."""

    def __init__(self, tmp_path_factory, edits):
        self._factory, self._edits, self._built = tmp_path_factory, edits, {}

    def __call__(self, name):
        if name not in self._built:
            relpath, old, new = self._edits[name]
            fork = copy_installed_deepspeed(str(self._factory.mktemp(f"fork-{name}")))
            edit(fork, relpath, old, new)
            self._built[name] = fork
        return self._built[name]
