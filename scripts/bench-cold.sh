#!/usr/bin/env bash
# Cold runs and snapshot builds of this tree against an older commit
# (1ef996e by default), side by side on the same machine.
#
#   ./scripts/bench-cold.sh             N=10 cold runs and 3 builds of each
#   N=20 BUILDS=5 ./scripts/bench-cold.sh
#
# Each version gets a state root of its own (the kernels linked from
# $ISOPOD_HOME, its own initramfs and base-min, since the agents speak
# different protocols). Then, alternating old and new, the order swapping
# every round:
#   cold    ISOPOD_WARM_POOL=off isopod run --no-network -- true
#   cold-n  ISOPOD_WARM_POOL=off isopod run --scratch-mib 1024 -- true
#           (with a NIC; the explicit size keeps the old version cold)
#   build   isopod warmpool build, in a fresh state root each time
# Printed: p50 of each and the ratio new/old (target: cold <= 0.85, builds
# likewise). Needs go, git, python3, and base-min built under $ISOPOD_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-10}
BUILDS=${BUILDS:-3}
OLD=${OLD:-1ef996e}
SRC_HOME=${ISOPOD_HOME:-$HOME/.isopod}
[ -f "$SRC_HOME/images/base-min.sqfs" ] || { echo "bench-cold: base-min not built under $SRC_HOME (./scripts/install.sh)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-cold-XXXXXX")
cleanup() {
  git worktree remove --force "$WORK/old-src" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "bench-cold: building this tree's binaries and $OLD's" >&2
go build -o "$WORK/new/" ./cmd/isopod
CGO_ENABLED=0 go build -o "$WORK/new/isopod-agent" ./cmd/isopod-agent
git worktree add --detach "$WORK/old-src" "$OLD" >/dev/null 2>&1
(cd "$WORK/old-src" && go build -o "$WORK/old/" ./cmd/isopod &&
  CGO_ENABLED=0 go build -o "$WORK/old/isopod-agent" ./cmd/isopod-agent)
git worktree remove --force "$WORK/old-src"

for v in new old; do
  t=$WORK/tmpl-$v
  mkdir -p "$t/images"
  ln -s "$SRC_HOME/kernels" "$t/kernels"
  [ -f "$SRC_HOME/accel-probe.json" ] && cp "$SRC_HOME/accel-probe.json" "$t/"
  ISOPOD_HOME=$t ISOPOD_AGENT_BIN=$WORK/$v/isopod-agent "$WORK/$v/isopod" image build base-min >/dev/null
done

python3 - "$WORK" "$N" "$BUILDS" <<'PY'
import json, os, shutil, statistics, subprocess, sys, time

work, n, builds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def home(v, name):
    h = os.path.join(work, "home-%s-%s" % (v, name))
    if not os.path.exists(h):
        t = os.path.join(work, "tmpl-" + v)
        os.makedirs(os.path.join(h, "images"))
        os.symlink(os.readlink(os.path.join(t, "kernels")), os.path.join(h, "kernels"))
        for f in os.listdir(t):
            p = os.path.join(t, f)
            if os.path.isfile(p) and not os.path.islink(p):
                shutil.copy(p, h)
        for f in os.listdir(os.path.join(t, "images")):
            os.link(os.path.join(t, "images", f), os.path.join(h, "images", f))
    return h

def isopod(v, h, args, extra=None):
    env = dict(os.environ, ISOPOD_HOME=h, ISOPOD_AGENT_BIN=os.path.join(work, v, "isopod-agent"))
    env.update(extra or {})
    t = time.monotonic()
    p = subprocess.run([os.path.join(work, v, "isopod")] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = (time.monotonic() - t) * 1000
    rep = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"ok": False}
    if not rep.get("ok"):
        print("  failed: %s %s" % (v, args), file=sys.stderr)
    return wall

series = {}
def add(name, v, ms):
    series.setdefault((name, v), []).append(ms)

cold = {"ISOPOD_WARM_POOL": "off"}
for i in range(n):
    for v in (("new", "old") if i % 2 == 0 else ("old", "new")):
        add("cold", v, isopod(v, home(v, "runs"), ["run", "--no-network", "--", "true"], cold))
        # --scratch-mib: the old version resumed networked runs of the
        # default scratch and has no switch to turn that off.
        add("cold-n", v, isopod(v, home(v, "runs"), ["run", "--scratch-mib", "1024", "--", "true"], cold))
for i in range(builds):
    for v in (("new", "old") if i % 2 == 0 else ("old", "new")):
        add("build", v, isopod(v, home(v, "build%d" % i), ["warmpool", "build"]))

print("%-8s %10s %10s %8s" % ("series", "new p50", "old p50", "new/old"))
for name in ("cold", "cold-n", "build"):
    a, b = statistics.median(series[(name, "new")]), statistics.median(series[(name, "old")])
    print("%-8s %8.0fms %8.0fms %8.2f" % (name, a, b, a / b))
PY
