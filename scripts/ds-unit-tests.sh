#!/usr/bin/env bash
# DeepSpeed's own ZeRO-3 unit tests, run on this CPU (DS_ACCELERATOR=cpu, gloo) twice: on stock
# DeepSpeed, and with pytest-zero3's reference coordinator injected into every process (pytest's, and
# the ranks DeepSpeed's harness starts: scripts/ds_unit/inject/sitecustomize.py). Then a table of both
# results side by side. A proof run: never in CI (416 tests for DeepSpeed v0.19.5's tests; measured
# 7-15 tests a minute a side on 2 busy cores, so about an hour for both). Run the sides one after the
# other, never two runs at once: some of DeepSpeed's tests bind the fixed port 29500 in pytest's own
# process and skip when it is taken.
#
#   scripts/ds-unit-tests.sh DEEPSPEED_CHECKOUT [--stock | --reference] [pytest args...]
#
# DEEPSPEED_CHECKOUT: a DeepSpeed source tree (its tests/ at least). The tests import the deepspeed
# of the checkout when it has a deepspeed/ package (as its own tests/conftest.py arranges), else the
# installed one. --stock or --reference runs one side only; the table is printed when the results
# of both sides are there (the other side's from an earlier run of the same checkout).
#
# The tests: tests/unit/runtime/zero/ and tests/unit/v1/zero/, less the files that test only ZeRO
# stages 0-2 or no engine (EXCLUDE below), less every item parametrized with a ZeRO stage other than 3
# (scripts/ds_unit/ds_unit.py); nightly tests are left out, DeepSpeed's `sequential` ones run (this
# run is sequential). DeepSpeed's CPU CI runs each test in its own fork: add --forked for that (pytest-
# forked is installed for it; about 3x slower, as each test then starts its own forkserver).
#
# Exit status: 1 when the reference fails (or skips) a test stock passes, except the tests of
# conformance/ds_unit_contradictions.toml, each named with the contract that contradicts it;
# 4 on a usage error; pytest's own status when a run could not complete (2, 3).
#
# Settings (environment):
#   ZERO3_DS_UNIT_OUT    results, logs and the Markdown table (default: proofs/ds-unit in this checkout)
#   ZERO3_DS_UNIT_TESTS  test paths relative to the checkout, instead of the default set
#   ZERO3_DS_UNIT_DEPS   where the test-only dependencies are installed, pinned, outside the environment
#                        (default: ${XDG_CACHE_HOME:-~/.cache}/pytest-zero3/ds-unit-deps)
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
here="$repo/scripts/ds_unit"

usage() { echo "usage: scripts/ds-unit-tests.sh DEEPSPEED_CHECKOUT [--stock | --reference] [pytest args...]" >&2; echo "$1" >&2; exit 4; }
[ $# -ge 1 ] || usage "give the DeepSpeed checkout whose tests to run"
checkout="$(cd "$1" 2>/dev/null && pwd)" || usage "$1: no such directory"
shift
[ -f "$checkout/tests/unit/common.py" ] || usage "$checkout has no tests/unit/common.py: give the root of a DeepSpeed checkout"
modes=(stock reference)
case "${1:-}" in
    --stock) modes=(stock); shift ;;
    --reference) modes=(reference); shift ;;
esac

# Test-only dependencies DeepSpeed's CPU CI uses that this environment does not need otherwise
# (requirements/requirements-dev.txt): pytest-forked, which needs py. Installed apart, not in the env.
deps="${ZERO3_DS_UNIT_DEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-zero3/ds-unit-deps}"
DEPS_PINNED=(pytest-forked==1.6.0 py==1.11.0)
if ! PYTHONPATH="$deps" python -c "import pytest_forked" 2>/dev/null; then
    echo "installing ${DEPS_PINNED[*]} into $deps" >&2
    python -m pip install -q --target "$deps" --no-deps "${DEPS_PINNED[@]}" || usage "could not install ${DEPS_PINNED[*]}"
fi

EXCLUDE=(
    tests/unit/runtime/zero/test_ignore_unused_parameters.py  # ZeRO-2 only
    tests/unit/runtime/zero/test_zero_tiled.py                # TiledLinear, no engine
    tests/unit/v1/zero/test_stage2_flatten_on_gpu.py          # stages 1-2
    tests/unit/v1/zero/test_zero2_offload_multi_backward.py   # stages 1-2
    tests/unit/v1/zero/test_overlap_comm_record_stream.py     # ZeRO-1/2 optimizer
    tests/unit/v1/zero/test_zero_cpu_offload_grad_accum.py    # ZeRO-2 only
    tests/unit/v1/zero/test_zero_torch_func.py                # stages 0-2
)
if [ -n "${ZERO3_DS_UNIT_TESTS:-}" ]; then
    read -r -a tests <<< "$ZERO3_DS_UNIT_TESTS"
else
    tests=()
    for f in "$checkout"/tests/unit/runtime/zero/test_*.py "$checkout"/tests/unit/v1/zero/test_*.py; do
        rel="${f#"$checkout"/}"
        [[ " ${EXCLUDE[*]} " == *" $rel "* ]] || tests+=("$rel")
    done
fi
[ ${#tests[@]} -gt 0 ] || usage "no test files found under $checkout/tests/unit"

out="${ZERO3_DS_UNIT_OUT:-$repo/proofs/ds-unit}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"  # the runs write it from the checkout's tests/
dspath=""
[ -f "$checkout/deepspeed/__init__.py" ] && dspath="$checkout"

status=0
for mode in "${modes[@]}"; do
    path="$here:$deps${dspath:+:$dspath}${PYTHONPATH:+:$PYTHONPATH}"
    [ "$mode" = reference ] && path="$here/inject:$path"
    rm -f "$out/$mode.json" "$out/$mode.processes"
    echo "== $mode: ${#tests[@]} files of $checkout (log: $out/$mode.log)"
    start=$(date +%s)
    # LOCAL_SIZE: the CPU accelerator's device count (else the NUMA node count, 1 here), so that
    # DeepSpeed's harness runs its 2- and 4-rank tests instead of skipping them for want of devices.
    # DS_UNITTEST_TIMEOUT: DeepSpeed's harness gives a hung test 600 s; 300 is ample on 2 cores.
    (cd "$checkout/tests" && env DS_ACCELERATOR=cpu LOCAL_SIZE=4 DS_UNITTEST_TIMEOUT=300 PYTHONPATH="$path" \
        ZERO3_DS_UNIT_MODE="$mode" ZERO3_DS_UNIT_CHECKOUT="$checkout" ZERO3_DS_UNIT_RESULTS="$out/$mode.json" \
        ZERO3_DS_UNIT_LOG="$out/$mode.processes" \
        python -m pytest -p ds_unit -p no:cacheprovider -m "not nightly" -rfE \
        "${tests[@]/#tests\//}" "$@") > "$out/$mode.log" 2>&1
    code=$?
    echo "   pytest exit $code in $(( $(date +%s) - start )) s: $(tail -1 "$out/$mode.log")"
    [ "$mode" = stock ] || echo "   processes that installed the reference (ranks inherit it from the forkserver): $(sort -u "$out/$mode.processes" 2>/dev/null | cut -d' ' -f2 | sort | uniq -c | tr -s ' ')"
    if [ "$code" -gt 1 ] && [ "$code" -ne 5 ]; then
        echo "   the $mode run did not complete; see $out/$mode.log" >&2
        status=$code
    fi
done
[ "$status" -eq 0 ] || exit "$status"

if [ -f "$out/stock.json" ] && [ -f "$out/reference.json" ]; then
    python "$here/ds_unit.py" compare "$out/stock.json" "$out/reference.json" --markdown "$out/table.md"
    status=$?
fi
exit "$status"
