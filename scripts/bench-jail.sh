#!/usr/bin/env bash
# What the VMM's jail costs: total_ms of `isopod run -- true` jailed (the
# default) against ISOPOD_JAIL=off, cold and warm, side by side in one
# process of this script.
#
#   ./scripts/bench-jail.sh            N=8 rounds
#   ./scripts/bench-jail.sh -n 12      N=12
#   SERIES=warm ./scripts/bench-jail.sh   warm runs only
#   KEEP=1 ./scripts/bench-jail.sh     keep the samples (one report a line)
#
# Each round runs one jailed and one unjailed run of a series back to back,
# the order swapping every round (ABBA...), so that load drift hits both
# alike: cold (ISOPOD_WARM_POOL=off) and warm (the default; a discarded
# run of each side first builds the snapshot and warms the caches). Every
# run is a new isopod process, as a CLI user's runs are. Reported: the
# medians of total_ms (from each report) and of boot_ms or resume_ms per
# side, the cost (jailed - unjailed) of the medians and the median of the
# per-round differences, and for cold runs their ratio (targets: under 3 %
# cold, under 10 ms warm).
#
# Uses bin/isopod (ISOPOD=path to override), the state root isopod would
# use ($ISOPOD_HOME), base-min (BASE=base-debian to change) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

N=8
while getopts "n:" opt; do
  case $opt in
    n) N=$OPTARG ;;
    *) echo "usage: $0 [-n N]" >&2; exit 2 ;;
  esac
done
ISOPOD=${ISOPOD:-$PWD/bin/isopod}
BASE=${BASE:-base-min}
command -v python3 >/dev/null || { echo "bench-jail: python3 not found" >&2; exit 1; }
[ -x "$ISOPOD" ] || { echo "bench-jail: $ISOPOD not built (go build -o bin/ ./cmd/...)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-jail-XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "bench-jail: samples in $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi
SAMPLES=$WORK/samples.jsonl
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# One run; appends {"series","jail","round",report...} to SAMPLES when
# keep is 1. A run whose guest went away (a VMM killed from outside) is
# run again, at most twice, and counted.
RETRIES=0
one() {
  local series=$1 jail=$2 round=$3 keep=$4 out rc attempt
  local env=(ISOPOD_JAIL="$jail")
  if [ "$series" = cold ]; then env+=(ISOPOD_WARM_POOL=off); fi
  for attempt in 1 2 3; do
    out=$(env "${env[@]}" "$ISOPOD" run --base "$BASE" -- true 2>>"$WORK/stderr.log") || true
    rc=0
    python3 - "$series" "$jail" "$round" "$keep" "$SAMPLES" "$out" <<'PY' || rc=$?
import json, sys
series, jail, rnd, keep, samples, out = sys.argv[1:]
try:
    r = json.loads(out)
except ValueError:
    sys.exit("bench-jail: %s jail=%s: no report: %r" % (series, jail, out[:2000]))
if r.get("guest_died") or "went away" in r.get("error", ""):
    print("bench-jail: %s jail=%s: the guest went away (%s); again" % (series, jail, r.get("guest_died_reason") or r.get("error")), file=sys.stderr)
    sys.exit(3)
if not r.get("ok") or r.get("exit_code") != 0:
    sys.exit("bench-jail: %s jail=%s failed: %s" % (series, jail, out[:2000]))
if keep == "1" and r.get("path") != series:
    sys.exit("bench-jail: a %s run took the %s path (warnings %s)" % (series, r.get("path"), r.get("warnings")))
unconfined = any("unconfined" in w for w in r.get("warnings") or [])
if unconfined != (jail == "off"):
    sys.exit("bench-jail: jail=%s but the report's warnings are %s" % (jail, r.get("warnings")))
if keep == "1":
    r.update(series=series, jail=jail, round=int(rnd))
    with open(samples, "a") as f:
        f.write(json.dumps(r) + "\n")
PY
    case $rc in
      0) return 0 ;;
      3) RETRIES=$((RETRIES + 1)) ;;
      *) exit 1 ;;
    esac
  done
  echo "bench-jail: $series jail=$jail: the guest went away three times" >&2
  exit 1
}

read -r -a series <<<"${SERIES:-cold warm}"
for s in "${series[@]}"; do
  echo "bench-jail: $s: warming up" >&2
  one "$s" on 0 0
  one "$s" off 0 0
done
for ((i = 1; i <= N; i++)); do
  echo "bench-jail: round $i of $N" >&2
  for s in "${series[@]}"; do
    if ((i % 2)); then one "$s" on "$i" 1; one "$s" off "$i" 1; else one "$s" off "$i" 1; one "$s" on "$i" 1; fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$SAMPLES" "$N" "$BASE" "$RETRIES" "$load_before" "$load_after" "$(nproc)" <<'PY'
import json, statistics, sys
samples, n, base, retries, load_before, load_after, cpus = sys.argv[1:]
rows = [json.loads(l) for l in open(samples)]
def vals(series, jail, key):
    return [r[key] for r in rows if r["series"] == series and r["jail"] == jail and r.get(key) is not None]
def med(xs):
    return statistics.median(xs) if xs else None
accel = ",".join(sorted({r.get("accel", "?") for r in rows}))
print("base %s, accel %s, N=%s rounds, %s CPUs, load average %s before, %s after; medians" % (base, accel, n, cpus, load_before, load_after))
print()
print("| series | jail | total_ms | boot_ms / resume_ms | exec_ms | min..max total_ms |")
print("|---|---|--:|--:|--:|--:|")
for s in ("cold", "warm"):
    for j in ("on", "off"):
        tot = vals(s, j, "total_ms")
        if not tot:
            continue
        start = vals(s, j, "resume_ms" if s == "warm" else "boot_ms")
        print("| %s | %s | %d | %d | %d | %d..%d |" % (s, j, med(tot), med(start), med(vals(s, j, "exec_ms")), min(tot), max(tot)))
print()
print("| series | jailed - off, medians (ms) | median of per-round differences (ms) | jailed / off | target |")
print("|---|--:|--:|--:|---|")
for s, target in (("cold", "< 3 %"), ("warm", "< 10 ms")):
    on, off = med(vals(s, "on", "total_ms")), med(vals(s, "off", "total_ms"))
    if on is None or off is None:
        continue
    by = {}
    for r in rows:
        if r["series"] == s:
            by.setdefault(r["round"], {})[r["jail"]] = r["total_ms"]
    diffs = [d["on"] - d["off"] for d in by.values() if "on" in d and "off" in d]
    print("| %s | %+d | %+d | %.3f | %s |" % (s, on - off, med(diffs), on / off, target))
if retries != "0":
    print()
    print("runs repeated because their guest went away: %s" % retries)
PY
