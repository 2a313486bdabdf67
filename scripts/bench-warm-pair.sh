#!/usr/bin/env bash
# Warm CLI runs of this tree against an older commit, paired: each round
# runs `isopod run -- true` once with each version (every run a new isopod
# process, as a CLI user's are), the order swapping every round, so that
# the host's drift falls on both alike.
#
#   OLD=e1e5d94 ./scripts/bench-warm-pair.sh          N=15 rounds
#   OLD=e1e5d94 N=30 ./scripts/bench-warm-pair.sh
#   ISOPOD_QEMU=/path/to/qemu OLD=... ./scripts/bench-warm-pair.sh
#
# Each version gets a state root of its own (the kernels linked from
# $ISOPOD_HOME, its own initramfs and base-min), and builds its snapshots
# first: the plain one and the default shape's with the root assembled
# (`warmpool build --stage base`), so that every measured run resumes
# with its root assembled, as a recurring shape's do. Printed: p50 of the
# report's total_ms, resume_ms and exec_ms and of the wall time of each
# version, the ratios new/old, and the median of the per-round total_ms
# differences, and the share of the host's CPU time stolen by its
# hypervisor meanwhile (a contended host's figures are slower and
# noisier). Needs go, git, python3, and base-min built under
# $ISOPOD_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-15}
OLD=${OLD:?set OLD to the commit to compare with}
SRC_HOME=${ISOPOD_HOME:-$HOME/.isopod}
[ -f "$SRC_HOME/images/base-min.sqfs" ] || { echo "bench-warm-pair: base-min not built under $SRC_HOME (./scripts/install.sh)" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-warm-pair-XXXXXX")
cleanup() {
  git worktree remove --force "$WORK/old-src" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "bench-warm-pair: building this tree's binaries and $OLD's" >&2
build() { # build SRC DEST: isopod, the static agent and, where the tree has it, isopod-jail
  (cd "$1" && go build -o "$2/" ./cmd/isopod &&
    CGO_ENABLED=0 go build -o "$2/isopod-agent" ./cmd/isopod-agent &&
    if [ -d cmd/isopod-jail ]; then CGO_ENABLED=0 go build -o "$2/isopod-jail" ./cmd/isopod-jail; fi)
}
build . "$WORK/new"
git worktree add --detach "$WORK/old-src" "$OLD" >/dev/null 2>&1
build "$WORK/old-src" "$WORK/old"
git worktree remove --force "$WORK/old-src"

for v in new old; do
  h=$WORK/home-$v
  mkdir -p "$h/images"
  ln -s "$SRC_HOME/kernels" "$h/kernels"
  export ISOPOD_AGENT_BIN=$WORK/$v/isopod-agent
  ISOPOD_HOME=$h "$WORK/$v/isopod" image build base-min >/dev/null
  ISOPOD_HOME=$h "$WORK/$v/isopod" warmpool build >/dev/null
  ISOPOD_HOME=$h "$WORK/$v/isopod" warmpool build --stage base >/dev/null
  unset ISOPOD_AGENT_BIN
done

python3 - "$WORK" "$N" <<'PY'
import json, os, statistics, subprocess, sys, time

work, n = sys.argv[1], int(sys.argv[2])
runs = {"new": [], "old": []}

def cpu():  # /proc/stat's aggregate ticks: all of them, and steal
    f = open("/proc/stat").readline().split()
    t = [int(x) for x in f[1:9]]
    return sum(t), t[7]

cpu0 = cpu()
for i in range(n + 1):
    for v in (("new", "old") if i % 2 == 0 else ("old", "new")):
        env = dict(os.environ, ISOPOD_HOME=os.path.join(work, "home-" + v),
                   ISOPOD_AGENT_BIN=os.path.join(work, v, "isopod-agent"))
        t = time.monotonic()
        p = subprocess.run([os.path.join(work, v, "isopod"), "run", "--", "true"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        wall = (time.monotonic() - t) * 1000
        rep = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        if rep.get("exit_code") != 0 or rep.get("path") != "warm":
            print("  %s: not a warm run that exited 0: %s" % (v, p.stdout[:200]), file=sys.stderr)
            continue
        if i > 0:  # the first round warms each version's caches
            runs[v].append((rep["total_ms"], rep.get("resume_ms") or 0, rep["exec_ms"], wall))

def p50(v, k):
    return statistics.median(r[k] for r in runs[v])

print("%-10s %8s %8s %8s" % ("p50 ms", "new", "old", "new/old"))
for k, name in enumerate(("total_ms", "resume_ms", "exec_ms", "wall")):
    a, b = p50("new", k), p50("old", k)
    print("%-10s %8.0f %8.0f %8.2f" % (name, a, b, a / b if b else 0))
m = min(len(runs["new"]), len(runs["old"]))
d = statistics.median(runs["new"][j][0] - runs["old"][j][0] for j in range(m))
print("rounds %d; median of the per-round total_ms differences, new - old: %+.0f ms" % (m, d))
cpu1 = cpu()
print("host steal (CPU time the hypervisor took for other guests): %.1f %%" % (100.0 * (cpu1[1] - cpu0[1]) / max(1, cpu1[0] - cpu0[0])))
PY
