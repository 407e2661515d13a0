#!/usr/bin/env bash
# Install what the suite and the tests need. torch is pinned first: 2.13.0 is the CPU wheel, and an
# unpinned torch would pull a multi-GB CUDA build. The package itself asks only for torch>=2.1.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet "deepspeed==0.19.8" -e ".[test]"
