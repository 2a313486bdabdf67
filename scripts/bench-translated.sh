#!/usr/bin/env bash
# How much guest code a warm run makes QEMU translate. Under TCG a new
# QEMU process translates every guest instruction it runs the first time,
# and that translation is most of a warm run's time; unlike milliseconds,
# the count hardly moves with the host's load. Each run here is
# `isopod run -- true` through a QEMU wrapper that logs each translated
# block (`-d in_asm`), unjailed (the jail would not let QEMU write its
# log); the wrapper is a VMM of its own, so it gets snapshots of its own,
# built first in a state root of its own (the kernels linked from
# $ISOPOD_HOME), removed at the end. Printed: per run, the guest instructions translated, in
# the guest kernel and in user space (the agent and the command), and
# their medians.
#
#   ./scripts/bench-translated.sh            5 runs
#   N=9 ./scripts/bench-translated.sh
#   ISOPOD_QEMU=/path/to/qemu-system-x86_64 ./scripts/bench-translated.sh
#
# Needs bin/ built (./scripts/install.sh), its kernel fetched, and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-5}
QEMU=${ISOPOD_QEMU:-$(command -v qemu-system-x86_64)}
SRC_HOME=${ISOPOD_HOME:-$HOME/.isopod}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-translated-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export ISOPOD_HOME=$WORK/home ISOPOD_JAIL=off ISOPOD_QEMU=$WORK/qemu
mkdir -p "$ISOPOD_HOME/images"
ln -s "$SRC_HOME/kernels" "$ISOPOD_HOME/kernels"

cat >"$WORK/qemu" <<EOF
#!/bin/sh
exec "$QEMU" "\$@" -d in_asm -D "$WORK/in_asm.%d.log"
EOF
chmod +x "$WORK/qemu"
echo "bench-translated: building base-min and the snapshots" >&2
bin/isopod image build base-min >/dev/null 2>&1
bin/isopod warmpool build >/dev/null 2>&1
bin/isopod warmpool build --stage base >/dev/null 2>&1

for i in $(seq "$N"); do
  rm -f "$WORK"/in_asm.*.log
  bin/isopod run -- true >"$WORK/report.json" 2>/dev/null
  python3 - "$WORK" <<'PY'
import glob, json, sys
work = sys.argv[1]
rep = json.load(open(work + "/report.json"))
if rep.get("path") != "warm" or not rep.get("root_assembled"):
    sys.exit("bench-translated: the run did not resume with its root assembled: %s" % rep.get("warnings"))
kernel = user = 0
for line in open(glob.glob(work + "/in_asm.*.log")[0], errors="replace"):
    if line.startswith("0x"):
        # Every instruction line; the guest kernel's addresses are the
        # upper half.
        if int(line.split(":")[0], 16) >= 0xffff800000000000:
            kernel += 1
        else:
            user += 1
print(kernel + user, kernel, user)
PY
done | tee "$WORK/counts" | awk '{printf "run %d: %d instructions translated (kernel %d, user %d)\n", NR, $1, $2, $3}'
python3 - "$WORK/counts" <<'PY'
import statistics, sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
med = [statistics.median(r[i] for r in rows) for i in range(3)]
print("median: %d instructions translated (kernel %d, user %d), %d runs" % (med[0], med[1], med[2], len(rows)))
PY
