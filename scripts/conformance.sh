#!/usr/bin/env bash
# The main job: the conformance suite against the installed deepspeed (its known failures declared)
# and against the reference coordinator under every config profile (the GPU-only ones report
# unsupported on a CPU world), each with a JSON and a Markdown report under reports/.
set -uo pipefail
cd "$(dirname "$0")/.."
# Python's default: keep bytecode caches (as .ci/run does; with PYTHONDONTWRITEBYTECODE set, every
# pytest process, forkserver and rank compiles this checkout from source again).
unset PYTHONDONTWRITEBYTECODE
bash scripts/install.sh
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
mkdir -p reports
python -m pytest --pyargs pytest_zero3.conformance --zero3-impl=installed \
    --zero3-expect=conformance/expectations/deepspeed-0.19.8.toml \
    --zero3-report=reports/installed.json --zero3-report-md=reports/installed.md "$@"
stock=$?
python -m pytest --pyargs pytest_zero3.conformance --zero3-impl=reference --zero3-profile=all \
    --zero3-report=reports/reference.json --zero3-report-md=reports/reference.md "$@"
reference=$?
echo "installed (with expectations): exit $stock; reference: exit $reference; reports in reports/"
exit $(( stock || reference ))
