#!/usr/bin/env bash
# What a workspace adds to a run, against the floor of piping the same tree
# in as a tar stream, cold and warm, side by side in one process.
#
#   ./scripts/bench-workspace.sh            N=5 rounds of each series
#   ./scripts/bench-workspace.sh -n 9       N=9
#   KEEP=1 ./scripts/bench-workspace.sh     keep the work directory (the tree)
#   SERIES="base ws" ./scripts/bench-workspace.sh   leave the (slow) tar floor out
#
# The tree is a git repository of 5,000 files, 50 MiB, mixed sizes, made
# the same way every time (seeded). Each round runs, in a rotating order:
#   base  isopod run -- true
#   ws    isopod run --workspace TREE -- true
#   tar   tar c -C TREE . | isopod run --stdin-file - -- tar x -C /tmp
# cold (ISOPOD_WARM_POOL=off) and warm (the default; one discarded run of
# each series first builds and warms the snapshot). Reported: the medians
# of total_ms (from each report), added = series - base, and the ratio
# added_ws / added_tar (target <= 0.5), with where the workspace's time goes
# (workspace.in_ms, boot_ms or resume_ms, exec_ms) and the host's own cost
# of reading and packing the tree (tar c, mksquashfs) for scale.
#
# Uses bin/isopod (ISOPOD=path to override), the state root isopod would
# use ($ISOPOD_HOME), base-min (BASE=base-debian to change), python3, git,
# tar and mksquashfs on the host.
set -euo pipefail
cd "$(dirname "$0")/.."

N=5
while getopts "n:" opt; do
  case $opt in
    n) N=$OPTARG ;;
    *) echo "usage: $0 [-n N]" >&2; exit 2 ;;
  esac
done
ISOPOD=${ISOPOD:-$PWD/bin/isopod}
BASE=${BASE:-base-min}
FILES=${FILES:-5000}
BYTES=${BYTES:-$((50 << 20))}
for tool in python3 git tar mksquashfs; do
  command -v "$tool" >/dev/null || { echo "bench-workspace: $tool not found" >&2; exit 1; }
done
[ -x "$ISOPOD" ] || { echo "bench-workspace: $ISOPOD not built (go build -o bin/ ./cmd/...)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-ws-XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
TREE=$WORK/tree
SAMPLES=$WORK/samples.jsonl

# The tree: sizes drawn from a seeded generator (most files small, a few
# large, like a source tree with some assets) and scaled to BYTES in all;
# text for files under 64 KiB, random bytes above.
echo "bench-workspace: making $FILES files, $BYTES bytes, in $TREE" >&2
python3 - "$TREE" "$FILES" "$BYTES" <<'PY'
import base64, os, random, sys
root, n, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(16)
weights = []
for i in range(n):
    r = rng.random()
    if r < 0.80:   weights.append(rng.uniform(0.2, 4))     # small sources
    elif r < 0.97: weights.append(rng.uniform(4, 40))      # larger sources
    else:          weights.append(rng.uniform(200, 1200))  # assets
scale = total / sum(weights)
sizes = [max(1, int(w * scale)) for w in weights]
sizes[-1] += total - sum(sizes)
for i, size in enumerate(sizes):
    d = os.path.join(root, "d%02d" % (i % 40), "s%02d" % (i % 7))
    os.makedirs(d, exist_ok=True)
    if size < 64 << 10:
        data = base64.b64encode(rng.randbytes(size))[:size]
        name = "f%04d.txt" % i
    else:
        data = rng.randbytes(size)
        name = "f%04d.bin" % i
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
PY
(
  cd "$TREE"
  export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@isopod.invalid \
    GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@isopod.invalid \
    GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z
  git init -q -b main && git add -A && git commit -q -m tree
)
tree_files=$(find "$TREE" -path "$TREE/.git" -prune -o -type f -print | wc -l)
tree_bytes=$(find "$TREE" -path "$TREE/.git" -prune -o -type f -printf '%s\n' | awk '{s += $1} END {print s}')
git_bytes=$(find "$TREE/.git" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
echo "bench-workspace: $tree_files files, $tree_bytes bytes outside .git, $git_bytes in .git" >&2

# One run of a series; appends {"mode","series","wall_ms",report...} to
# SAMPLES when keep is 1. A run whose guest went away (a VMM killed from
# outside, e.g. by another state root's housekeeping) is run again, at
# most twice, and counted.
RETRIES=0
one() {
  local mode=$1 series=$2 keep=$3 out t0 t1 rc attempt
  local env=()
  if [ "$mode" = cold ]; then env=(ISOPOD_WARM_POOL=off); fi
  for attempt in 1 2 3; do
    t0=$(date +%s%N)
    case $series in
      base) out=$(env "${env[@]}" "$ISOPOD" run --base "$BASE" --no-network -- true 2>>"$WORK/stderr.log") || true ;;
      ws)   out=$(env "${env[@]}" "$ISOPOD" run --base "$BASE" --no-network --workspace "$TREE" -- true 2>>"$WORK/stderr.log") || true ;;
      tar)  out=$(tar c -C "$TREE" . | env "${env[@]}" "$ISOPOD" run --base "$BASE" --no-network --timeout-s 900 \
                    --stdin-file - -- tar x -C /tmp 2>>"$WORK/stderr.log") || true ;;
    esac
    t1=$(date +%s%N)
    rc=0
    python3 - "$mode" "$series" $(((t1 - t0) / 1000000)) "$keep" "$SAMPLES" "$out" <<'PY' || rc=$?
import json, sys
mode, series, wall, keep, samples, out = sys.argv[1:]
try:
    r = json.loads(out)
except ValueError:
    sys.exit("bench-workspace: %s %s: no report: %r" % (mode, series, out[:2000]))
if r.get("guest_died") or "went away" in r.get("error", ""):
    print("bench-workspace: %s %s: the guest went away (%s); again" % (mode, series, r.get("guest_died_reason") or r.get("error")), file=sys.stderr)
    sys.exit(3)
if not r.get("ok") or r.get("exit_code") != 0:
    sys.exit("bench-workspace: %s %s failed: %s" % (mode, series, out[:2000]))
if keep == "1":
    r.update(mode=mode, series=series, wall_ms=int(wall))
    with open(samples, "a") as f:
        f.write(json.dumps(r) + "\n")
PY
    case $rc in
      0) return 0 ;;
      3) RETRIES=$((RETRIES + 1)) ;;
      *) exit 1 ;;
    esac
  done
  echo "bench-workspace: $mode $series: the guest went away three times" >&2
  exit 1
}

read -r -a series <<<"${SERIES:-base ws tar}"
for mode in cold warm; do
  echo "bench-workspace: $mode: warming up" >&2
  for s in "${series[@]}"; do one "$mode" "$s" 0; done
  for ((i = 0; i < N; i++)); do
    echo "bench-workspace: $mode: round $((i + 1)) of $N" >&2
    for ((j = 0; j < ${#series[@]}; j++)); do one "$mode" "${series[$(((i + j) % ${#series[@]}))]}" 1; done
  done
done

# The host's own cost of reading and packing the tree, for scale.
t0=$(date +%s%N); tar c -C "$TREE" . >/dev/null; t1=$(date +%s%N)
host_tar=$(((t1 - t0) / 1000000))
t0=$(date +%s%N)
mksquashfs "$TREE" "$WORK/tree.sqfs" -noappend -all-root -no-progress -quiet -noI -noD -noF -noX -no-xattrs >/dev/null
t1=$(date +%s%N)
host_sqfs=$(((t1 - t0) / 1000000))

python3 - "$SAMPLES" "$N" "$tree_files" "$tree_bytes" "$git_bytes" "$host_tar" "$host_sqfs" "$BASE" "$RETRIES" <<'PY'
import json, statistics, sys
samples, n, files, tbytes, gbytes, host_tar, host_sqfs, base, retries = sys.argv[1:]
rows = [json.loads(l) for l in open(samples)]
def med(mode, series, get):
    vals = [get(r) for r in rows if r["mode"] == mode and r["series"] == series]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
def paths(mode, series):
    ps = [r.get("path") for r in rows if r["mode"] == mode and r["series"] == series]
    return ",".join(sorted(set(ps)))
fmt = lambda v: "-" if v is None else "%d" % v
print("tree: %s files, %s bytes outside .git, %s in .git; base %s; N=%s, medians" % (files, tbytes, gbytes, base, n))
print()
print("| mode | series | path | total_ms | wall_ms | in_ms | boot/resume_ms | exec_ms |")
print("|---|---|---|--:|--:|--:|--:|--:|")
for mode in ("cold", "warm"):
    for s in ("base", "ws", "tar"):
        if not any(r["mode"] == mode and r["series"] == s for r in rows):
            continue
        tot = med(mode, s, lambda r: r.get("total_ms"))
        wall = med(mode, s, lambda r: r.get("wall_ms"))
        inms = med(mode, s, lambda r: (r.get("workspace") or {}).get("in_ms"))
        boot = med(mode, s, lambda r: r.get("resume_ms") if r.get("path") == "warm" else r.get("boot_ms"))
        ex = med(mode, s, lambda r: r.get("exec_ms"))
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (mode, s, paths(mode, s), fmt(tot), fmt(wall), fmt(inms), fmt(boot), fmt(ex)))
print()
print("| mode | measure | added ws (ms) | added tar (ms) | ratio ws/tar (target <= 0.5) |")
print("|---|---|--:|--:|--:|")
for mode in ("cold", "warm"):
    for key in ("total_ms", "wall_ms"):
        b = med(mode, "base", lambda r: r[key])
        w = med(mode, "ws", lambda r: r[key])
        t = med(mode, "tar", lambda r: r[key])
        aw = w - b
        at = t - b if t is not None else None
        ratio = "%.2f" % (aw / at) if at else "-"
        print("| %s | %s | %d | %s | %s |" % (mode, key, aw, fmt(at), ratio))
print()
if retries != "0":
    print("runs repeated because their guest went away: %s" % retries)
print("host alone: tar c of the tree %s ms; mksquashfs of the tree (as a workspace packs it) %s ms" % (host_tar, host_sqfs))
PY
