#!/usr/bin/env bash
# The whole suite under drawn fork configs (--zero3-config=draw:SEED, fixtures/pytest_side/overlays.py): the reference
# must pass every contract under each, and stock deepspeed may fail only what its expectations file lists.
# A red is the suite's mistake (fixed in the twin, fixtures/twin.py) or a real bug (docs/results/bugs.md):
# `pytest --pyargs pytest_zero3.conformance --zero3-impl=reference --zero3-config=draw:SEED` replays it.
# Not in CI (about 2 min per draw and implementation on a quiet 2-core machine); CI runs the cheap half,
# tests/test_overlay.py.
#
#   bash scripts/draws.sh [FIRST_SEED [COUNT]]    (default: the seeds that together draw every value of
#                                                  every key, overlays.covering(): 0 to 8 and 13)
#
# Writes proofs/draws/{reference,installed}-SEED.{txt,json} and proofs/draws/result.txt. Exit status: 1 when
# any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# Python's default: keep bytecode caches (as .ci/run does; with PYTHONDONTWRITEBYTECODE set, every
# pytest process, forkserver and rank compiles this checkout from source again).
unset PYTHONDONTWRITEBYTECODE
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
if [ $# -gt 0 ]; then
    seeds=$(seq "$1" $(( $1 + ${2:-8} - 1 )))
else
    seeds=$(python -c 'from pytest_zero3.fixtures.pytest_side import overlays; print(*overlays.covering())')
fi
out=proofs/draws
mkdir -p "$out"
code=0
: > "$out/result.txt"
for seed in $seeds; do
    for impl in reference installed; do
        extra=()
        if [ "$impl" = installed ]; then
            extra=(--zero3-expect=conformance/expectations/deepspeed-0.19.8.toml)
        fi
        python -m pytest --pyargs pytest_zero3.conformance -p no:cacheprovider -q --zero3-impl="$impl" \
            --zero3-config="draw:$seed" --zero3-report="$out/$impl-$seed.json" "${extra[@]}" \
            > "$out/$impl-$seed.txt" 2>&1 || code=1
        line="draw:$seed $impl: $(grep -E '^contracts:' "$out/$impl-$seed.txt" | tail -n 1)"
        echo "$line" | tee -a "$out/result.txt"
    done
done
echo "date: $(date -u +%Y-%m-%d); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); exit: $code" \
    | tee -a "$out/result.txt"
exit "$code"
