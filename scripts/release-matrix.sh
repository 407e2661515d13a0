#!/usr/bin/env bash
# The conformance suite across DeepSpeed releases (not part of CI: it builds DeepSpeed sdists).
#
# For each release: build the sdist once into a wheel cache (DS_BUILD_OPS=0, no build isolation,
# against the venv's torch), make one venv per release, install that wheel and this checkout, check
# that deepspeed imports, run the whole suite against it with a JSON report (and the release's
# expectations file when there is one), then render one Markdown table of contracts x releases into
# the manual's page docs/results/release-matrix.md between the release-matrix markers (failure messages:
# docs/release-matrix.md). Then the opt-in fw family (the frameworks: transformers, accelerate, PEFT, TRL at
# the lock's versions) runs apart against the same release, into its own table between the
# release-matrix-fw markers (messages: docs/release-matrix-fw.md); a release the frameworks refuse shows
# its contracts unsupported with the reason. A second run reuses the wheels and the venvs.
#
# Usage: scripts/release-matrix.sh [RELEASE...]     (default: the releases below; with releases given,
#        only those are built and run, and the table keeps the other columns from their last reports,
#        or from the pages as committed where this machine has no report of them)
# Settings (environment):
#   ZERO3_MATRIX_CACHE   wheel cache; venvs and logs go under it
#                        (default: ${XDG_CACHE_HOME:-~/.cache}/pytest-zero3/ds-wheels)
#   ZERO3_MATRIX_OUT     JSON reports and run logs (default: reports/release-matrix in this checkout)
#   ZERO3_MATRIX_PYTHON  interpreter the venvs are made from (default: python3)
#   ZERO3_MATRIX_NICE    niceness of builds and suite runs (default: 15)
#   ZERO3_MATRIX_RENDER  0 to skip rewriting the release-matrix pages (default: 1)
#   ZERO3_MATRIX_SUITE   0 to only build the wheels and venvs (e.g. before `tox -e ds-X.Y.Z`); fw to run
#                        the fw family alone (the suite's columns stay as last measured)
#   ZERO3_MATRIX_FW      0 to leave the fw family out (default: 1)
#   PYTEST_ADDOPTS       passed through to every suite run (e.g. "-n 2")
#
# Adding a release: append it to RELEASES (and to TORCH_FOR if it does not import on the default
# torch), run this script, write conformance/expectations/deepspeed-X.Y.Z.toml naming the reason of
# each FAIL, re-run, add a tox env `ds-X.Y.Z`.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

# The newest patch of each minor from 0.14, plus the releases around the activation-checkpoint fix
# (DeepSpeed PR 8148, first in 0.19.3). pytest_zero3/impl.py MATRIX_RELEASES lists the same releases.
RELEASES=(0.14.5 0.15.4 0.16.9 0.17.6 0.18.9 0.19.2 0.19.3 0.19.8)
DEFAULT_TORCH=2.13.0
# release -> torch, for a release whose deepspeed does not import on DEFAULT_TORCH (none so far).
declare -A TORCH_FOR=()
# The frameworks at the versions of the lock (accelerate) and of its note on the frameworks extra (trl, datasets).
PIN_DEPS=(transformers==5.24.0 peft==0.21.2 accelerate==1.15.0 trl==1.16.0 datasets==5.2.0 hypothesis==6.155.2
          pytest==9.0.3 pytest-xdist==3.8.0)

cache="${ZERO3_MATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-zero3/ds-wheels}"
out="${ZERO3_MATRIX_OUT:-$repo/reports/release-matrix}"
py="${ZERO3_MATRIX_PYTHON:-python3}"
nice_n="${ZERO3_MATRIX_NICE:-15}"
ALL=("${RELEASES[@]}")  # the table always shows these; a run of some releases re-renders the rest from their reports
[ $# -gt 0 ] && RELEASES=("$@")
mkdir -p "$cache/venvs" "$cache/logs" "$out"
export DS_ACCELERATOR=cpu DS_BUILD_OPS=0
run_nice() { nice -n "$nice_n" "$@"; }

# One status file per release, read by the renderer: why a column has no report, or which torch it ran on.
status() {  # release key value...
    "$py" - "$out/deepspeed-$1.status.json" "${@:2}" <<'EOF'
import json, sys
path, kv = sys.argv[1], sys.argv[2:]
try:
    data = json.load(open(path))
except (OSError, ValueError):
    data = {}
data.update(zip(kv[::2], kv[1::2]))
json.dump(data, open(path, "w"), indent=1)
EOF
}

prepare() {  # release -> venv ready with deepspeed, or returns non-zero with the reason in the status
    local v="$1" torch="${TORCH_FOR[$1]:-$DEFAULT_TORCH}" venv="$cache/venvs/deepspeed-$1" log="$cache/logs/deepspeed-$1.log"
    local wheel="$cache/deepspeed-$v-py3-none-any.whl"
    status "$v" torch "$torch" default_torch "$DEFAULT_TORCH"
    # A venv that got everything once is reused as it is (pip's dependency checks take minutes on a
    # loaded machine); delete the venv to rebuild it.
    local ready="$venv/.zero3-ready" want="torch==$torch deepspeed==$v ${PIN_DEPS[*]}"
    if [ -f "$wheel" ] && [ "$(cat "$ready" 2>/dev/null)" = "$want" ]; then
        echo "  wheel and venv cached: $wheel"
    else
        rm -f "$ready"
        install_release "$v" "$torch" "$venv" "$log" "$wheel" || return 1
        echo "$want" >"$ready"
    fi
    # The checkout is reinstalled every time (not editable: the suite runs with --pyargs from the venv).
    run_nice "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$checkout_wheel" \
        >>"$log" 2>&1 || { status "$v" error "pytest-zero3 does not install (see $log)"; return 1; }
    local err
    if ! err=$(cd / && "$venv/bin/python" -c "import deepspeed, deepspeed.runtime.zero" 2>&1); then
        status "$v" error "import deepspeed fails on torch $torch: $(printf '%s\n' "$err" | grep -v '^\s' | tail -1)"
        return 1
    fi
}

install_release() {  # release torch venv log wheel -> venv with torch, the wheel (built once) and the pinned deps
    local v="$1" torch="$2" venv="$3" log="$4" wheel="$5"
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv" >>"$log" 2>&1 || { status "$v" error "python -m venv failed (see $log)"; return 1; }
    fi
    run_nice "$venv/bin/python" -m pip install --quiet "torch==$torch" >>"$log" 2>&1 \
        || { status "$v" error "torch==$torch does not install (see $log)"; return 1; }
    if [ -f "$wheel" ]; then
        echo "  wheel cached: $wheel"
    else
        echo "  building $wheel"
        local t0=$SECONDS
        run_nice "$venv/bin/python" -m pip wheel --no-deps --no-build-isolation --no-cache-dir \
            "deepspeed==$v" -w "$cache" >>"$log" 2>&1 \
            || { status "$v" error "the deepspeed $v sdist does not build with torch $torch (see $log)"; return 1; }
        echo "  built in $((SECONDS - t0)) s"
    fi
    run_nice "$venv/bin/python" -m pip install --quiet "$wheel" "${PIN_DEPS[@]}" >>"$log" 2>&1 \
        || { status "$v" error "deepspeed $v's dependencies do not install (see $log)"; return 1; }
}

suite() {  # release [fw] -> JSON report; exit status of the run (0: green with the expectations file)
    local v="$1" venv="$cache/venvs/deepspeed-$1" expect="$repo/conformance/expectations/deepspeed-$1.toml"
    local name="deepspeed-$v${2:+-$2}"  # the fw family's run: deepspeed-X.Y.Z-fw.*
    local args=(--pyargs pytest_zero3.conformance --zero3-impl=installed -p no:cacheprovider
                --zero3-report="$out/$name.json" --zero3-report-md="$out/$name.md")
    [ -f "$expect" ] && args+=(--zero3-expect="$expect")
    [ -n "${2:-}" ] && args+=(--zero3-select="$2")
    rm -f "$out/$name.json"
    # From a scratch directory, so the installed package is what runs, not this checkout.
    local work; work="$(mktemp -d)"
    (cd "$work" && run_nice "$venv/bin/python" -m pytest "${args[@]}") >"$out/$name.log" 2>&1
    local rc=$?
    rm -rf "$work"
    status "$v${2:+-$2}" exit "$rc" expectations "$([ -f "$expect" ] && echo "deepspeed-$v.toml" || echo "")"
    [ -f "$out/$name.json" ] || status "$v${2:+-$2}" error "the suite wrote no report (exit $rc; see $out/$name.log)"
    return $rc
}

# This checkout as a wheel, built once per run from a copy of its files (an in-tree build writes
# build/ in the checkout, which two runs at once would share).
wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$wheel_dir" \
    && "$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$wheel_dir/dist" "$wheel_dir" >"$out/checkout-wheel.log" 2>&1 \
    || { echo "this checkout does not build as a wheel: see $out/checkout-wheel.log"; exit 1; }
checkout_wheel="$(ls "$wheel_dir"/dist/pytest_zero3-*.whl)"

start=$SECONDS
for v in "${RELEASES[@]}"; do
    t0=$SECONDS
    rm -f "$out/deepspeed-$v.status.json"
    echo "deepspeed $v"
    if prepare "$v"; then
        [ "${ZERO3_MATRIX_SUITE:-1}" = 0 ] && { echo "  prepared in $((SECONDS - t0)) s"; continue; }
        echo "  prepared in $((SECONDS - t0)) s"
        if [ "${ZERO3_MATRIX_SUITE:-1}" != fw ]; then
            t1=$SECONDS
            suite "$v"; rc=$?
            echo "  suite exit $rc in $((SECONDS - t1)) s (log: $out/deepspeed-$v.log)"
            status "$v" seconds "$((SECONDS - t1))"
        fi
        if [ "${ZERO3_MATRIX_FW:-1}" != 0 ]; then
            rm -f "$out/deepspeed-$v-fw.status.json"
            status "$v-fw" torch "${TORCH_FOR[$v]:-$DEFAULT_TORCH}" default_torch "$DEFAULT_TORCH"
            t1=$SECONDS
            suite "$v" fw; rc=$?
            echo "  fw family exit $rc in $((SECONDS - t1)) s (log: $out/deepspeed-$v-fw.log)"
            status "$v-fw" seconds "$((SECONDS - t1))"
        fi
    else
        why=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error"))' "$out/deepspeed-$v.status.json")
        echo "  skipped: $why"
        [ "${ZERO3_MATRIX_FW:-1}" = 0 ] || { rm -f "$out/deepspeed-$v-fw.status.json"; status "$v-fw" error "$why"; }
    fi
done
echo "all releases in $((SECONDS - start)) s"
if [ "${ZERO3_MATRIX_RENDER:-1}" != 0 ] && [ "${ZERO3_MATRIX_SUITE:-1}" != 0 ]; then
    shown=$(printf '%s\n' "${ALL[@]}" "${RELEASES[@]}" | sort -u)
    [ "${ZERO3_MATRIX_SUITE:-1}" = fw ] || "$py" "$repo/scripts/render_matrix.py" --reports "$out" \
        --page "$repo/docs/results/release-matrix.md" --details "$repo/docs/release-matrix.md" $shown
    [ "${ZERO3_MATRIX_FW:-1}" = 0 ] || "$py" "$repo/scripts/render_matrix.py" --reports "$out" --family fw \
        --page "$repo/docs/results/release-matrix.md" --details "$repo/docs/release-matrix-fw.md" $shown
fi
