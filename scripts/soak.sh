#!/usr/bin/env bash
# Soak test (not in CI): the whole conformance suite N times against the reference and against the
# installed deepspeed with its expectations file, serially and with `-n 2`, then every test outcome
# that changed between runs of the same implementation (a flake), and the wall times.
#
#   bash scripts/soak.sh [N] [extra pytest args...]     # N defaults to 10
#
# Results (per-run logs, JUnit XML, JSON reports, times.tsv) go to $SOAK_DIR (default soak/).
# SOAK_SUMMARY_ONLY=1 skips the runs and summarises what $SOAK_DIR holds (e.g. an interrupted soak).
# SOAK_LOAD=1 runs every run under load: one busy process per core (SOAK_LOAD_PROCS to choose how
# many) beside the suite, stopped when the soak ends however it ends; a flake or false red that
# only load brings out shows up as a changed outcome.
# SOAK_MODES chooses the modes (default "serial n2"; "serial" alone halves a soak's time).
# Exit status: 1 when any outcome changed between runs, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
N="${1:-10}"
shift || true
OUT="${SOAK_DIR:-soak}"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
mkdir -p "$OUT"
load_pids=()
suite_pid=
stop_load() {
    for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null; done
    load_pids=()
}
trap stop_load EXIT
trap '[ -n "$suite_pid" ] && kill -TERM "$suite_pid" 2>/dev/null && wait "$suite_pid"; stop_load; exit 130' INT TERM
if [ -n "${SOAK_LOAD:-}" ] && [ -z "${SOAK_SUMMARY_ONLY:-}" ]; then
    procs="${SOAK_LOAD_PROCS:-$(nproc)}"
    for _ in $(seq 1 "$procs"); do
        python -c "while True: pass" &
        load_pids+=($!)
    done
    echo "load: $procs busy processes beside the suite (pids ${load_pids[*]})"
fi
version=$(python -c "from importlib.metadata import version; print(version('deepspeed'))")
expect="conformance/expectations/deepspeed-$version.toml"
[ -n "${SOAK_SUMMARY_ONLY:-}" ] && N=0 || printf "impl\tmode\trun\texit\twall_s\n" > "$OUT/times.tsv"
for run in $(seq 1 "$N"); do
    for impl in reference installed; do
        for mode in ${SOAK_MODES:-serial n2}; do
            name="$impl-$mode-$run"
            args=(-p no:cacheprovider -q --pyargs pytest_zero3.conformance "--zero3-impl=$impl"
                  "--junitxml=$OUT/$name.xml" "--zero3-report=$OUT/$name.json")
            [ "$impl" = installed ] && [ -f "$expect" ] && args+=("--zero3-expect=$expect")
            [ "$mode" = n2 ] && args+=(-n 2)
            start=$(date +%s.%N)
            python -m pytest "${args[@]}" "$@" > "$OUT/$name.log" 2>&1 &
            suite_pid=$!
            wait "$suite_pid"  # in the background, so that a stop of the soak is acted on at once
            code=$?
            suite_pid=
            wall=$(python -c "print(f'{$(date +%s.%N) - $start:.1f}')")
            printf "%s\t%s\t%s\t%s\t%s\n" "$impl" "$mode" "$run" "$code" "$wall" >> "$OUT/times.tsv"
            echo "run $run/$N $impl $mode: exit $code, ${wall} s"
        done
    done
done
stop_load
python - "$OUT" <<'EOF'
"""Every test outcome that differs between runs of one implementation, and the wall times."""
import collections
import csv
import glob
import os
import statistics
import sys
import xml.etree.ElementTree as ET

out = sys.argv[1]
outcomes = collections.defaultdict(lambda: collections.defaultdict(list))  # impl -> test -> [(run, outcome)]
for path in sorted(glob.glob(os.path.join(out, "*.xml"))):
    impl, mode, run = os.path.basename(path)[:-4].rsplit("-", 2)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:  # a run still in progress or interrupted
        continue
    for case in root.iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        message = next((child.get("message", "") for child in case if child.tag in ("failure", "error", "skipped")), "")
        outcome = kinds[0] if kinds else "passed"
        outcomes[impl][test].append((f"{mode}-{run}", outcome, message.splitlines()[0][:160] if message else ""))
flakes = 0
for impl, tests in sorted(outcomes.items()):
    for test, seen in sorted(tests.items()):
        if len({o for _, o, _ in seen}) > 1:
            flakes += 1
            print(f"CHANGED {impl} {test}")
            for where, outcome, message in seen:
                print(f"    {where}: {outcome} {message}")
rows = list(csv.DictReader(open(os.path.join(out, "times.tsv")), delimiter="\t"))
walls = collections.defaultdict(list)
for row in rows:
    walls[(row["impl"], row["mode"])].append(float(row["wall_s"]))
print("\nwall time per run (s): impl mode  n  mean  min  max")
for (impl, mode), values in sorted(walls.items()):
    print(f"  {impl:9s} {mode:6s} {len(values):2d} {statistics.mean(values):6.1f} {min(values):6.1f} {max(values):6.1f}")
for impl in sorted({i for i, _ in walls}):
    if walls.get((impl, "serial")) and walls.get((impl, "n2")):
        print(f"  {impl}: -n 2 speed-up {statistics.mean(walls[(impl, 'serial')]) / statistics.mean(walls[(impl, 'n2')]):.2f}x")
bad_exit = [r for r in rows if r["exit"] not in ("0",)]
print(f"\n{flakes} test(s) changed outcome between runs; {len(bad_exit)} run(s) exited non-zero"
      + "".join(f"\n  {r['impl']} {r['mode']} run {r['run']}: exit {r['exit']}" for r in bad_exit))
sys.exit(1 if flakes else 0)
EOF
