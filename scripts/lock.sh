#!/usr/bin/env bash
# Regenerate constraints.txt, the lock that scripts/install.sh, .ci/run and tox install under: every
# package CI and the main job install (test stack, lint, types, docs, transformers, peft), resolved
# in a fresh virtual environment. The package's own requirements stay ranges (pyproject.toml); only
# this file moves, by hand, after `tox -e latest` (unlocked) has shown a new release to be good.
# torch and deepspeed are pinned by name where they are installed (torch 2.13.0 is the CPU wheel;
# deepspeed differs per release-matrix env), so the lock holds only what they pull in.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet "deepspeed==0.19.8" -e ".[test,docs]"
# the frameworks extra's note (not locked: CI does not install it) is kept as it stands, to be edited by hand
extra="$(sed -n '/^# Not installed by CI nor locked above/,$p' constraints.txt)"
{
    echo "# The lock: every package CI and the main job install, at the versions CI last passed with."
    echo "# Made by scripts/lock.sh (fresh venv, Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')); used as pip constraints"
    echo "# (-c) by scripts/install.sh and tox. torch and deepspeed are pinned where they are installed."
    "$venv/bin/python" -m pip freeze --all --exclude-editable | grep -viE "^(pip|torch|deepspeed|pytest-zero3)=="
    if [ -n "$extra" ]; then echo "$extra"; fi
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages"
