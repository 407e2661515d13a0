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
