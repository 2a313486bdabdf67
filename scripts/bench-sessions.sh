#!/usr/bin/env bash
# What an exec in a running session costs against a warm run, side by
# side in one process of this script, each call a new isopod process as a
# CLI user's are:
#
#   exec     `session exec S -- true` (exec_ms, CLI wall) against a warm
#            `run -- true` (total_ms, CLI wall), interleaved;
#   idle     the CPU an idle running session's QEMU uses over 30 s.
#
# A session's pause, resume and fork: scripts/bench-session-pause.sh.
#
#   ./scripts/bench-sessions.sh          N=10 samples per series
#   ./scripts/bench-sessions.sh -n 20
#   KEEP=1 ./scripts/bench-sessions.sh   keep the samples
#
# Targets: exec_ms p50 <= 0.15x warm total_ms p50; exec wall <= 0.35x run
# wall; idle <= 2 % of one core.
#
# Uses bin/isopod (ISOPOD=path to override), the state root isopod would
# use ($ISOPOD_HOME), base-min (BASE=... to change), jq and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

N=10
while getopts "n:" opt; do
  case $opt in
    n) N=$OPTARG ;;
    *) echo "usage: $0 [-n N]" >&2; exit 2 ;;
  esac
done
ISOPOD=${ISOPOD:-$PWD/bin/isopod}
BASE=${BASE:-base-min}
for t in jq python3; do command -v $t >/dev/null || { echo "bench-sessions: $t not found" >&2; exit 1; }; done
[ -x "$ISOPOD" ] || { echo "bench-sessions: $ISOPOD not built (go build -o bin/ ./cmd/...)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-sessions-XXXXXX")
SESSIONS=()
cleanup() {
  for s in "${SESSIONS[@]}"; do "$ISOPOD" session stop "$s" >/dev/null 2>&1 || true; done
  if [ "${KEEP:-0}" = 1 ]; then echo "bench-sessions: samples in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
SAMPLES=$WORK/samples.jsonl
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# call SERIES ARGS...: runs isopod ARGS, appends {"series","wall_ms",report}
# to SAMPLES; fails the script when the call did not answer ok.
call() {
  local series=$1 t0 t1 out
  shift
  t0=$(now_ms)
  out=$("$ISOPOD" "$@" 2>>"$WORK/stderr.log") || true
  t1=$(now_ms)
  if ! jq -e '.ok == true' >/dev/null 2>&1 <<<"$out"; then
    echo "bench-sessions: $series: isopod $*: ${out:0:2000}" >&2
    tail -5 "$WORK/stderr.log" >&2
    exit 1
  fi
  jq -c --arg s "$series" --argjson w $((t1 - t0)) '{series: $s, wall_ms: $w, r: .}' <<<"$out" >>"$SAMPLES"
  LAST=$out
}

start() { # start NAME ARGS...: a running session, stopped at exit
  local name=$1
  shift
  call start session start --base "$BASE" --name "$name" --idle-timeout-s 3600 "$@"
  SESSIONS+=("$name")
}

RUN=(run --base "$BASE" --no-network -- true)
call discard "${RUN[@]}" # builds the warm snapshot when there is none
call discard "${RUN[@]}"

echo "bench-sessions: exec" >&2
start bench-exec --no-network
call discard session exec bench-exec -- true
for _ in $(seq "$N"); do
  call exec session exec bench-exec -- true
  call run_exec "${RUN[@]}"
done

echo "bench-sessions: idle" >&2
vm=$(jq -r .vm_id <<<"$(jq -c 'select(.series=="start") | .r' "$SAMPLES" | tail -1)")
pid=$(pgrep -f "qemu-system.*$vm" | head -1 || true)
idle_pct=null
if [ -n "$pid" ] && [ -r "/proc/$pid/stat" ]; then
  sleep 5
  tick=$(getconf CLK_TCK)
  c0=$(awk '{print $14+$15}' "/proc/$pid/stat")
  sleep 30
  c1=$(awk '{print $14+$15}' "/proc/$pid/stat")
  idle_pct=$(python3 -c "print(round(($c1-$c0)/$tick/30*100, 3))")
fi
"$ISOPOD" session stop bench-exec >/dev/null

python3 - "$SAMPLES" "$N" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" "$idle_pct" <<'PY'
import json, os, platform, statistics, sys
samples, n, load0, load1, idle = sys.argv[1:]
by = {}
for line in open(samples):
    s = json.loads(line)
    by.setdefault(s["series"], []).append(s)
def p50(series, key):
    v = [s["wall_ms"] if key == "wall_ms" else s["r"].get(key) for s in by.get(series, [])]
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
out = {
    "n": int(n), "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
    "load_before": load0, "load_after": load1,
    "exec_ms_p50": p50("exec", "exec_ms"), "exec_wall_p50": p50("exec", "wall_ms"),
    "run_total_ms_p50": p50("run_exec", "total_ms"), "run_wall_p50": p50("run_exec", "wall_ms"),
    "idle_cpu_pct_of_core_30s": None if idle == "null" else float(idle),
}
out["ratios"] = {
    "exec_ms_over_warm_total": ratio(out["exec_ms_p50"], out["run_total_ms_p50"]),
    "exec_wall_over_run_wall": ratio(out["exec_wall_p50"], out["run_wall_p50"]),
}
print(json.dumps(out, indent=2))
PY
