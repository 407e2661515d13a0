#!/usr/bin/env bash
# Soak test (not in CI): the whole conformance suite N times against each implementation (the reference,
# the installed deepspeed with its expectations file, and any fork checkout named), then every test
# outcome that changed: between runs of the same implementation, and against a run on a quiet machine.
#
#   bash scripts/soak.sh [N] [extra pytest args...]     # N defaults to 10
#
# Results (per-run logs, JUnit XML, JSON reports, times.tsv, load.tsv) go to $SOAK_DIR (default soak/).
# SOAK_SUMMARY_ONLY=1 skips the runs and summarises what $SOAK_DIR holds (e.g. an interrupted soak).
# SOAK_IMPLS chooses the implementations (default "reference installed"); a directory there is a fork
#   checkout, run as --zero3-impl=DIR with the installed release's expectations file (SOAK_EXPECT to
#   name another), e.g. a copy of the installed deepspeed: mkdir -p /tmp/fork && cp -r "$(python -c
#   'import deepspeed, os; print(os.path.dirname(deepspeed.__file__))')" /tmp/fork/
# SOAK_LOAD=1 runs every run under load: busy processes beside the suite (SOAK_LOAD_PROCS, default four
#   per core: a load well above the cores, as on a shared CI runner), stopped when the soak ends however
#   it ends. Each implementation first runs SOAK_QUIET_RUNS times (default 1) with no load: the outcomes
#   every loaded run must repeat. A false red that only load brings out shows up as a changed outcome.
# SOAK_MODES chooses the modes (default "serial n2"; "serial" alone halves a soak's time; "auto" leaves
#   the worker count to the plugin, as a plain gate run does).
# Exit status: 1 when any outcome changed, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
N="${1:-10}"
shift || true
OUT="${SOAK_DIR:-soak}"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
mkdir -p "$OUT"
load_pids=()
suite_pid=
sampler_pid=
stop_load() {
    for pid in "${load_pids[@]}" $sampler_pid; do kill "$pid" 2>/dev/null; done
    for pid in "${load_pids[@]}" $sampler_pid; do wait "$pid" 2>/dev/null; done
    load_pids=()
    sampler_pid=
}
trap stop_load EXIT
trap '[ -n "$suite_pid" ] && kill -TERM "$suite_pid" 2>/dev/null && wait "$suite_pid"; stop_load; exit 130' INT TERM
start_load() {
    local procs="${SOAK_LOAD_PROCS:-$(( 4 * $(nproc) ))}"
    for _ in $(seq 1 "$procs"); do
        python -c "while True: pass" &
        load_pids+=($!)
    done
    # the 1-minute load average every 15 s, for the summary
    ( while true; do printf "%s\t%s\n" "$(date +%s)" "$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/load.tsv"; sleep 15; done ) &
    sampler_pid=$!
    echo "load: $procs busy processes beside the suite on $(nproc) cores"
}
version=$(python -c "from importlib.metadata import version; print(version('deepspeed'))")
expect="${SOAK_EXPECT:-conformance/expectations/deepspeed-$version.toml}"
name_of() {  # a file-name-safe name for an implementation: reference, installed, or dir-<basename>
    if [ -d "$1" ]; then echo "dir_$(basename "$1" | tr -c 'A-Za-z0-9_\n' '_')"; else echo "$1"; fi
}
one_run() {  # impl mode run-label
    local impl="$1" mode="$2" label="$3"
    local name
    name="$(name_of "$impl")-$mode-$label"
    local args=(-p no:cacheprovider -q --pyargs pytest_zero3.conformance "--zero3-impl=$impl"
                "--junitxml=$OUT/$name.xml" "--zero3-report=$OUT/$name.json")
    [ "$impl" != reference ] && [ -f "$expect" ] && args+=("--zero3-expect=$expect")
    case "$mode" in
        serial) args+=(-n 0) ;;
        n2) args+=(-n 2) ;;
    esac
    local start code wall
    start=$(date +%s.%N)
    python -m pytest "${args[@]}" "${extra[@]}" > "$OUT/$name.log" 2>&1 &
    suite_pid=$!
    wait "$suite_pid"  # in the background, so that a stop of the soak is acted on at once
    code=$?
    suite_pid=
    wall=$(python -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    printf "%s\t%s\t%s\t%s\t%s\n" "$(name_of "$impl")" "$mode" "$label" "$code" "$wall" >> "$OUT/times.tsv"
    echo "$label $(name_of "$impl") $mode: exit $code, ${wall} s"
}
every_run() {  # run-label: one run of each implementation in each mode
    for impl in "${impls[@]}"; do
        for mode in "${modes[@]}"; do one_run "$impl" "$mode" "$1"; done
    done
}
extra=("$@")
impls=(${SOAK_IMPLS:-reference installed})
modes=(${SOAK_MODES:-serial n2})
if [ -z "${SOAK_SUMMARY_ONLY:-}" ]; then
    printf "impl\tmode\trun\texit\twall_s\n" > "$OUT/times.tsv"
    rm -f "$OUT/load.tsv"
    if [ -n "${SOAK_LOAD:-}" ]; then
        for q in $(seq 1 "${SOAK_QUIET_RUNS:-1}"); do every_run "quiet$q"; done
        start_load
    fi
    for run in $(seq 1 "$N"); do every_run "$run"; done
    stop_load
fi
python - "$OUT" <<'PYEOF'
"""Every test outcome that differs from the quiet runs of its implementation and mode (or, with no quiet
run, between runs), the flake rate with its 95 % interval, the load, and the wall times."""
import collections
import csv
import glob
import math
import os
import statistics
import sys
import xml.etree.ElementTree as ET

out = sys.argv[1]
# (impl, mode) -> test -> [(label, outcome, message)]
outcomes = collections.defaultdict(lambda: collections.defaultdict(list))
for path in sorted(glob.glob(os.path.join(out, "*.xml"))):
    impl, mode, label = os.path.basename(path)[:-4].rsplit("-", 2)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:  # a run still in progress or interrupted
        continue
    for case in root.iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        marks = [child for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = marks[0].tag if marks else "passed"
        if marks and marks[0].tag == "skipped" and marks[0].get("type") == "pytest.xfail":
            outcome = "xfailed"
        message = marks[0].get("message", "") if marks else ""
        outcomes[(impl, mode)][test].append((label, outcome, message.splitlines()[0][:160] if message else ""))


def upper95(k: int, n: int) -> float:
    """The 95 % upper bound of a rate seen k times in n (exact for k = 0, Wilson's score above)."""
    if n == 0:
        return 1.0
    if k == 0:
        return 1 - 0.05 ** (1 / n)
    p, z = k / n, 1.96
    return (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)


changed = judged = 0
for (impl, mode), tests in sorted(outcomes.items()):
    for test, seen in sorted(tests.items()):
        quiet = {o for label, o, _ in seen if label.startswith("quiet")}
        loaded = [(label, o, m) for label, o, m in seen if not label.startswith("quiet")]
        judged += len(loaded)
        reference = quiet or {loaded[0][1]} if loaded else quiet
        bad = [(label, o, m) for label, o, m in loaded if o not in reference]
        if bad or len(quiet) > 1:
            changed += len(bad)
            print(f"CHANGED {impl} {mode} {test}")
            for label, o, m in seen:
                print(f"    {label}: {o} {m}")
print(f"\n{judged} test outcomes judged against the quiet run (or the first run) of their implementation and mode; "
      f"{changed} changed: flake rate {changed / judged if judged else 0:.2%}, 95 % upper bound "
      f"{upper95(changed, judged):.2%}")
load_path = os.path.join(out, "load.tsv")
if os.path.exists(load_path):
    loads = [float(line.split("\t")[1]) for line in open(load_path) if "\t" in line]
    if loads:
        print(f"load average (1 min) while loaded, {len(loads)} samples: mean {statistics.mean(loads):.1f}, "
              f"min {min(loads):.1f}, max {max(loads):.1f} on {os.cpu_count()} cores")
rows = list(csv.DictReader(open(os.path.join(out, "times.tsv")), delimiter="\t"))
walls = collections.defaultdict(list)
for row in rows:
    walls[(row["impl"], row["mode"], row["run"].startswith("quiet"))].append(float(row["wall_s"]))
print("\nwall time per run (s): impl mode quiet/loaded  n  mean  min  max")
for (impl, mode, quiet), values in sorted(walls.items()):
    print(f"  {impl:12s} {mode:6s} {'quiet' if quiet else 'loaded':6s} {len(values):2d} "
          f"{statistics.mean(values):6.1f} {min(values):6.1f} {max(values):6.1f}")
bad_exit = [r for r in rows if r["exit"] != "0"]
print(f"\n{changed} outcome(s) changed; {len(bad_exit)} run(s) exited non-zero"
      + "".join(f"\n  {r['impl']} {r['mode']} run {r['run']}: exit {r['exit']}" for r in bad_exit))
sys.exit(1 if changed or bad_exit else 0)
PYEOF
