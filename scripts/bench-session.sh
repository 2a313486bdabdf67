#!/usr/bin/env bash
# An agent-like session, the same on every machine, run with this tree's
# isopod and with the isopod of an older commit (1ef996e, before every run
# could resume warm), side by side.
#
#   ./scripts/bench-session.sh               2 rounds
#   ROUNDS=3 ./scripts/bench-session.sh      3 rounds
#   MCP=0 ./scripts/bench-session.sh         without the MCP series
#   KEEP=1 ./scripts/bench-session.sh        keep the work directory (samples.jsonl)
#
# The session, each call an `isopod run` timed from start to exit:
#    1  base            run -- true
#    1  install+commit  run --commit-as app -- sh -c '<writes 200 files under /opt/app>'
#   20  fork            run --stage app -- sh -c 'ls /opt/app | wc -l'
#    3  no-network      run --stage app --no-network -- true
#    2  commit          run --stage app --commit-as app-N -- sh -c 'echo N > /opt/app/extra'
#    3  filtered        run --stage app --deny-egress -- true
# No call needs the network. Each session runs in a fresh state root of its
# own (kernels linked, images linked or built, no snapshot, no stage), so
# each starts with the first use of every shape. Old and new sessions
# alternate, the order swapping every round. After each new session, in
# its state root:
#   cold commits   the session's three commits again with ISOPOD_WARM_POOL=off
#   paired         8 x (run -- true, run --stage app -- true), alternating:
#                  warm base against warm fork, same command, same load
#   MCP            isopod-mcp, 10 sandbox_run calls of `true` on base-min,
#                  3 s apart (an agent's think time), with ISOPOD_READY_VMS=0
#                  and =1 (order swapping every round)
# Printed: every call's path and wall time, then the ratios against their
# targets (session wall new/old <= 0.3, warm fork p50 / warm base p50 <=
# 1.1, warm commit p50 / cold commit p50 <= 0.3, MCP total_ms p50 ready /
# none <= 0.7) and where a warm call's time goes (p50 of resume_ms,
# exec_ms, teardown_ms, commit_ms and the rest).
#
# The old binaries are built from OLD (default 1ef996e) in a temporary git
# worktree, removed once built; the old version builds its own initramfs
# and base-min (base-min's busybox is fetched from the host's apt mirrors),
# since its agent speaks an older protocol. The new ones are built from
# this tree. Kernels come from the state root isopod would use
# ($ISOPOD_HOME, default ~/.isopod), which must have base-min built.
# Needs go, git, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
OLD=${OLD:-1ef996e}
MCP=${MCP:-1}
SRC_HOME=${ISOPOD_HOME:-$HOME/.isopod}
for tool in go git python3; do
  command -v "$tool" >/dev/null || { echo "bench-session: $tool not found" >&2; exit 1; }
done
[ -f "$SRC_HOME/images/base-min.sqfs" ] || { echo "bench-session: base-min not built under $SRC_HOME (./scripts/install.sh)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/isopod-bench-session-XXXXXX")
cleanup() {
  git worktree remove --force "$WORK/old-src" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then
    echo "bench-session: kept $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

echo "bench-session: building this tree's binaries" >&2
go build -o "$WORK/new/" ./cmd/isopod ./cmd/isopod-mcp
CGO_ENABLED=0 go build -o "$WORK/new/isopod-agent" ./cmd/isopod-agent

echo "bench-session: building $OLD's binaries" >&2
git worktree add --detach "$WORK/old-src" "$OLD" >/dev/null 2>&1
(cd "$WORK/old-src" && go build -o "$WORK/old/" ./cmd/isopod ./cmd/isopod-mcp &&
  CGO_ENABLED=0 go build -o "$WORK/old/isopod-agent" ./cmd/isopod-agent)
git worktree remove --force "$WORK/old-src"

# Templates of a state root for each: the kernels linked, the images each
# version's agent and recipe want.
template() { # $1: new|old
  local t=$WORK/tmpl-$1
  mkdir -p "$t/images"
  ln -s "$SRC_HOME/kernels" "$t/kernels"
  [ -f "$SRC_HOME/accel-probe.json" ] && cp "$SRC_HOME/accel-probe.json" "$t/"
  if [ "$1" = new ]; then
    for f in base-min.sqfs base-min.json; do
      ln "$SRC_HOME/images/$f" "$t/images/$f" 2>/dev/null || cp "$SRC_HOME/images/$f" "$t/images/$f"
    done
    ISOPOD_HOME=$t ISOPOD_AGENT_BIN=$WORK/new/isopod-agent "$WORK/new/isopod" image build initramfs >/dev/null
  else
    ISOPOD_HOME=$t ISOPOD_AGENT_BIN=$WORK/old/isopod-agent "$WORK/old/isopod" image build base-min >/dev/null
  fi
}
echo "bench-session: images for each version" >&2
template new
template old

python3 - "$WORK" "$ROUNDS" "$MCP" <<'PY'
import json, os, shutil, signal, statistics, subprocess, sys, time

work, rounds, do_mcp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
samples = open(os.path.join(work, "samples.jsonl"), "w")
INSTALL = "mkdir -p /opt/app && for i in $(seq 200); do echo $i > /opt/app/f$i; done"

def session_calls():
    c = [("base", ["--", "true"]),
         ("install+commit", ["--commit-as", "app", "--", "sh", "-c", INSTALL])]
    c += [("fork", ["--stage", "app", "--", "sh", "-c", "ls /opt/app | wc -l"])] * 20
    c += [("no-network", ["--stage", "app", "--no-network", "--", "true"])] * 3
    c += [("commit", ["--stage", "app", "--commit-as", "app-%d" % k, "--", "sh", "-c", "echo %d > /opt/app/extra" % k]) for k in (1, 2)]
    c += [("filtered", ["--stage", "app", "--deny-egress", "--", "true"])] * 3
    return c

def fresh_home(version, rnd):
    home = os.path.join(work, "home-%s-%d" % (version, rnd))
    tmpl = os.path.join(work, "tmpl-" + version)
    os.makedirs(os.path.join(home, "images"))
    os.symlink(os.readlink(os.path.join(tmpl, "kernels")), os.path.join(home, "kernels"))
    for f in os.listdir(tmpl):
        if os.path.isfile(os.path.join(tmpl, f)) and not os.path.islink(os.path.join(tmpl, f)):
            shutil.copy(os.path.join(tmpl, f), home)
    for f in os.listdir(os.path.join(tmpl, "images")):
        if f.endswith((".sqfs", ".json", ".cpio")):
            os.link(os.path.join(tmpl, "images", f), os.path.join(home, "images", f))
    return home

def env_for(version, home, extra=None):
    e = dict(os.environ, ISOPOD_HOME=home, ISOPOD_AGENT_BIN=os.path.join(work, version, "isopod-agent"))
    e.update(extra or {})
    return e

def isopod(version, home, args, extra=None):
    t = time.monotonic()
    p = subprocess.run([os.path.join(work, version, "isopod")] + args, env=env_for(version, home, extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = (time.monotonic() - t) * 1000
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = {"ok": False, "error": p.stdout[-300:] + p.stderr[-300:]}
    return rep, wall

def record(series, version, rnd, i, what, rep, wall):
    row = {"series": series, "version": version, "round": rnd, "i": i, "what": what, "wall_ms": round(wall),
           "ok": rep.get("ok", True) and rep.get("exit_code") == 0}
    for k in ("path", "snapshot_built", "ready_vm", "total_ms", "boot_ms", "resume_ms", "exec_ms",
              "teardown_ms", "commit_ms", "snapshot_build_ms", "error", "commit_error", "duration_ms"):
        if rep.get(k) is not None:
            row[k] = rep[k]
    samples.write(json.dumps(row) + "\n")
    samples.flush()
    if not row["ok"]:
        print("  !! %s %s call %d (%s) failed: %s" % (version, series, i, what, rep.get("error") or rep.get("commit_error") or rep.get("exit_code")))
    return row

def run_session(version, rnd):
    home = fresh_home(version, rnd)
    print("\n%s session, round %d (%s)" % (version, rnd, home))
    rows = []
    t0 = time.monotonic()
    for i, (what, args) in enumerate(session_calls()):
        rep, wall = isopod(version, home, ["run"] + args)
        row = record("session", version, rnd, i, what, rep, wall)
        rows.append(row)
        built = " (built its snapshot)" if row.get("snapshot_built") else ""
        print("  %2d %-15s %-5s %6d ms%s" % (i + 1, what, row.get("path", "-"), row["wall_ms"], built))
    total = (time.monotonic() - t0) * 1000
    print("  session wall: %.1f s" % (total / 1000))
    samples.write(json.dumps({"series": "session-total", "version": version, "round": rnd, "wall_ms": round(total)}) + "\n")
    return home, total, rows

def cold_commits(home, rnd):
    print("  cold commits (ISOPOD_WARM_POOL=off):", end="")
    calls = [("install+commit", ["--commit-as", "cold-app", "--", "sh", "-c", INSTALL])]
    calls += [("commit", ["--stage", "cold-app", "--commit-as", "cold-app-%d" % k, "--", "sh", "-c", "echo %d > /opt/app/extra" % k]) for k in (1, 2)]
    for i, (what, args) in enumerate(calls):
        rep, wall = isopod("new", home, ["run"] + args, {"ISOPOD_WARM_POOL": "off"})
        row = record("cold-commit", "new", rnd, i, what, rep, wall)
        print(" %s %d ms" % (row.get("path"), row["wall_ms"]), end="")
    print()

def paired(home, rnd):
    print("  paired warm base / fork:", end="")
    for i in range(16):
        what, args = ("base", ["--", "true"]) if i % 2 == 0 else ("fork", ["--stage", "app", "--", "true"])
        rep, wall = isopod("new", home, ["run"] + args)
        row = record("paired", "new", rnd, i, what, rep, wall)
        print(" %s:%s:%d" % (what, row.get("path"), row["wall_ms"]), end="")
    print()

class MCPClient:
    def __init__(self, home, ready):
        self.p = subprocess.Popen([os.path.join(work, "new", "isopod-mcp")], cwd=home,
                                  env=env_for("new", home, {"ISOPOD_READY_VMS": str(ready)}),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.id = 0
        self.req("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "bench-session", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, m):
        self.p.stdin.write(json.dumps(m) + "\n")
        self.p.stdin.flush()

    def req(self, method, params):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("isopod-mcp closed its stdout")
            m = json.loads(line)
            if m.get("id") == self.id:
                if "error" in m:
                    raise RuntimeError(str(m["error"]))
                return m["result"]

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

def mcp_series(home, rnd, ready):
    c = MCPClient(home, ready)
    out = []
    try:
        for i in range(10):
            t = time.monotonic()
            res = c.req("tools/call", {"name": "sandbox_run", "arguments": {"cmd": "true", "base": "base-min"}})
            wall = (time.monotonic() - t) * 1000
            rep = dict(res.get("structuredContent") or {})
            if res.get("isError"):
                rep = {"ok": False, "error": str(res.get("content"))[:300]}
            row = record("mcp-ready-%d" % ready, "new", rnd, i, "true", rep, wall)
            out.append(row)
            time.sleep(3)
    finally:
        c.close()
    print("  MCP ISOPOD_READY_VMS=%d: %s" % (ready, " ".join(
        "%s%s:%d" % (r.get("path", "-"), "+ready" if r.get("ready_vm") else "", r.get("total_ms", -1)) for r in out)))

def leftovers(home):
    """QEMU processes of a state root's VMs (they must all be gone)."""
    vms = set("isopod-" + d for d in os.listdir(os.path.join(home, "vms"))) if os.path.isdir(os.path.join(home, "vms")) else set()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and b"qemu-system" in argv[0] and any(a.decode(errors="replace") in vms for a in argv):
            pids.append(int(d))
    return pids

def finish(home):
    for pid in leftovers(home):
        print("  !! a QEMU of %s was left running (pid %d); killing it" % (home, pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(home, ignore_errors=True)

session_wall = {"old": [], "new": []}
for rnd in range(1, rounds + 1):
    order = ["old", "new"] if rnd % 2 == 1 else ["new", "old"]
    for version in order:
        home, total, rows = run_session(version, rnd)
        session_wall[version].append(total)
        if version == "new":
            cold_commits(home, rnd)
            paired(home, rnd)
            if do_mcp:
                for ready in ([0, 1] if rnd % 2 == 1 else [1, 0]):
                    mcp_series(home, rnd, ready)
        finish(home)
samples.close()

# Summary.
rows = [json.loads(l) for l in open(os.path.join(work, "samples.jsonl"))]
def sel(**kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]
def p50(xs):
    return statistics.median(xs) if xs else float("nan")

print("\n== summary over %d rounds ==" % rounds)
for v in ("old", "new"):
    print("%s session wall: %s s" % (v, ", ".join("%.1f" % (w / 1000) for w in session_wall[v])))
ratios = [n / o for n, o in zip(session_wall["new"], session_wall["old"])]
print("session wall new/old: %s (p50 %.2f; target <= 0.3)" % (", ".join("%.2f" % r for r in ratios), p50(ratios)))

print("\nper call, p50 wall ms (path counts):")
for what in ("base", "install+commit", "fork", "no-network", "commit", "filtered"):
    line = "  %-15s" % what
    for v in ("old", "new"):
        rs = sel(series="session", version=v, what=what)
        paths = {}
        for r in rs:
            paths[r.get("path", "-")] = paths.get(r.get("path", "-"), 0) + 1
        line += "  %s %6.0f %s" % (v, p50([r["wall_ms"] for r in rs]), paths)
    print(line)

# Every call after the first of its shape resumes warm. Shapes of the
# session: the NIC shape (everything but --no-network) and the NIC-less one.
cold_after_first = []
for rnd in range(1, rounds + 1):
    seen = set()
    for r in sorted(sel(series="session", version="new", round=rnd), key=lambda r: r["i"]):
        shape = "no-nic" if r["what"] == "no-network" else "nic"
        if shape in seen and r.get("path") != "warm":
            cold_after_first.append((rnd, r["i"], r["what"], r.get("path")))
        seen.add(shape)
print("\nnew: calls after the first of their shape not warm: %s" % (cold_after_first or "none"))

pb = [r["wall_ms"] for r in sel(series="paired", what="base") if r.get("path") == "warm"]
pf = [r["wall_ms"] for r in sel(series="paired", what="fork") if r.get("path") == "warm"]
sf = [r["wall_ms"] for r in sel(series="session", version="new", what="fork")]
print("warm fork p50 / warm base p50 (paired): %.0f / %.0f = %.2f (target <= 1.1); session forks p50 %.0f" % (
    p50(pf), p50(pb), p50(pf) / p50(pb), p50(sf)))

wc = [r for r in sel(series="session", version="new") if r["what"] in ("install+commit", "commit")]
cc = sel(series="cold-commit")
print("warm commit p50 / cold commit p50: %.0f / %.0f = %.2f (target <= 0.3)" % (
    p50([r["wall_ms"] for r in wc]), p50([r["wall_ms"] for r in cc]),
    p50([r["wall_ms"] for r in wc]) / p50([r["wall_ms"] for r in cc])))

if do_mcp:
    m0 = sel(series="mcp-ready-0")
    m1 = sel(series="mcp-ready-1")
    # The first call of each server may be a cold boot or a plain resume.
    t0 = [r["total_ms"] for r in m0 if "total_ms" in r]
    t1 = [r["total_ms"] for r in m1 if "total_ms" in r]
    print("MCP total_ms p50, ISOPOD_READY_VMS=1 / =0: %.0f / %.0f = %.2f (target <= 0.7); served by a ready VM: %d of %d" % (
        p50(t1), p50(t0), p50(t1) / p50(t0), sum(1 for r in m1 if r.get("ready_vm")), len(m1)))

print("\nwhere a warm call's time goes (new, p50 ms):")
for what in ("fork", "commit", "no-network", "filtered"):
    rs = [r for r in sel(series="session", version="new") if r["what"] in ((what, "install+commit") if what == "commit" else (what,)) and r.get("path") == "warm" and not r.get("snapshot_built")]
    if not rs:
        continue
    parts = {k: p50([r.get(k, 0) for r in rs]) for k in ("resume_ms", "exec_ms", "teardown_ms", "commit_ms", "total_ms", "wall_ms")}
    rest = parts["total_ms"] - parts["resume_ms"] - parts["exec_ms"] - parts["teardown_ms"] - parts["commit_ms"]
    print("  %-10s n=%-3d wall %5.0f  total %5.0f = resume %5.0f + exec %5.0f + teardown %4.0f + commit %4.0f + rest %5.0f" % (
        what, len(rs), parts["wall_ms"], parts["total_ms"], parts["resume_ms"], parts["exec_ms"], parts["teardown_ms"], parts["commit_ms"], rest))
if do_mcp:
    for ready in (0, 1):
        rs = [r for r in sel(series="mcp-ready-%d" % ready) if r.get("path") == "warm"]
        if rs:
            print("  MCP ready=%d n=%-3d total %5.0f = resume %5.0f + exec %5.0f + teardown %4.0f" % (
                ready, len(rs), p50([r["total_ms"] for r in rs]), p50([r.get("resume_ms", 0) for r in rs]),
                p50([r.get("duration_ms", 0) for r in rs]), p50([r.get("teardown_ms", 0) for r in rs])))
oc = [r for r in sel(series="session", version="old") if r.get("path") == "cold"]
if oc:
    print("  old cold  n=%-3d wall %5.0f  total %5.0f, boot %5.0f + exec %5.0f" % (len(oc), p50([r["wall_ms"] for r in oc]),
          p50([r.get("total_ms", 0) for r in oc]), p50([r.get("boot_ms", 0) for r in oc]), p50([r.get("exec_ms", 0) for r in oc])))
PY
