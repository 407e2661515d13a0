#!/usr/bin/env bash
# Install what the suite and the tests need, every package at its version in constraints.txt (the lock,
# made by scripts/lock.sh): a new release of a tool on the package index changes nothing here.
# torch is pinned first: 2.13.0 is the CPU wheel, and an unpinned torch would pull a multi-GB CUDA
# build. The package itself asks only for ranges (torch>=2.1); `tox -e latest` runs unlocked.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip takes about 3.5 s to find an installed requirement satisfied: asked only when torch is not 2.13.0.
if ! python -c "import sys, importlib.metadata as m; sys.exit(m.version('torch').split('+')[0] != '2.13.0')" 2>/dev/null; then
    python -m pip install --quiet "torch==2.13.0"
fi
# This package's build needs only setuptools: with it already here, pip skips making an isolated build
# environment for the editable install (about 6 s).
isolation=()
if python -c "import sys, setuptools; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" 2>/dev/null; then
    isolation=(--no-build-isolation)
fi
python -m pip install --quiet "${isolation[@]}" -c constraints.txt "deepspeed==0.19.8" -e ".[test]"
# DeepSpeedCPUAdam (the bf16-offload profile's optimizer) is JIT-built: about 2.5 min on 2 cores, once
# per machine, into the extensions directory the suite uses; here, outside any test's timeout.
# Skipped where it is built (its .so in that directory): the check itself imports torch and deepspeed (6 s).
ext="$(python -c "from pytest_zero3 import impl; print(impl.extensions_dir(impl.parse('installed')))")"
if ! compgen -G "$ext/cpu_adam/*.so" > /dev/null; then
    python -c "from pytest_zero3 import impl; impl.prepare_process(impl.parse('installed')); import pytest_zero3.fixtures.cpu_adam_op"
fi
