package warmpool

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"isopod/integration/e2e"
)

// Every shape of run resumes from its shape's snapshot: forks of
// a chain of stages, commits, --no-network, filtered egress, other memory
// sizes. Each run below also checks that its clone is a machine of its own.

// hygieneCmd prints, before a run's own command, what makes a clone its
// own: "H <boot id> <16 random bytes> <hostname> <clock>".
const hygieneCmd = `echo "H $(cat /proc/sys/kernel/random/boot_id) $(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') $(hostname) $(date +%s)"`

// clones checks every run's hygiene line and remembers the boot IDs and
// random bytes seen, which no two runs may share.
type clones struct {
	mu   sync.Mutex
	seen map[string]string // a boot id or random bytes: the run that had it
}

func newClones() *clones { return &clones{seen: map[string]string{}} }

// firstCold is the path of a shape's run: the one that builds its plain
// snapshot runs on in the snapshot's VM, booted; later ones resume.
func firstCold(built bool) string {
	if built {
		return "cold"
	}
	return "warm"
}

// hygienic is cmd after the hygiene line, as `sh -c` arguments.
func hygienic(cmd string) []string { return []string{"sh", "-c", hygieneCmd + "; " + cmd} }

// run is `isopod run ARGS -- sh -c 'HYGIENE; CMD'` in env, which must exit
// 0 on the given path (built: it built its snapshot); it checks the clone's
// hygiene and returns the report and the command's own stdout.
func (c *clones) run(t *testing.T, env []string, what, path string, built bool, args []string, cmd string) (*e2e.Result, string) {
	t.Helper()
	before := time.Now()
	r := warmRun(t, env, append(append(args, "--"), hygienic(cmd)...)...)
	after := time.Now()
	wantPath(t, r, path, built)
	return r, c.check(t, what, r, before, after)
}

// check holds r's hygiene line to the clone rules: a boot ID and random
// bytes no other run had, the run's name as hostname, and a clock within
// the call. It returns the rest of stdout.
func (c *clones) check(t *testing.T, what string, r *e2e.Result, before, after time.Time) string {
	t.Helper()
	first, rest, _ := strings.Cut(e2e.Str(r.JSON, "stdout"), "\n")
	f := strings.Fields(first)
	if len(f) != 5 || f[0] != "H" || len(f[1]) != 36 || len(f[2]) != 32 {
		t.Errorf("%s: no hygiene line in stdout %q", what, e2e.Str(r.JSON, "stdout"))
		return rest
	}
	if name := e2e.Str(r.JSON, "name"); f[3] != name {
		t.Errorf("%s: hostname %q; want the run's name %q", what, f[3], name)
	}
	secs, err := strconv.ParseInt(f[4], 10, 64)
	// Whole seconds: the guest's clock may read up to a second behind.
	if guest := time.Unix(secs, 0); err != nil || guest.Before(before.Add(-2*time.Second)) || guest.After(after.Add(2*time.Second)) {
		t.Errorf("%s: guest clock %s (%v) outside the call [%v, %v]", what, f[4], err, before.Truncate(time.Second), after)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range f[1:3] {
		if prev, dup := c.seen[v]; dup {
			t.Errorf("%s and %s share %q (a boot ID or random bytes)", prev, what, v)
		}
		c.seen[v] = what
	}
	return rest
}

// ok is an isopod subcommand in env that must succeed.
func ok(t *testing.T, env []string, args ...string) map[string]any {
	t.Helper()
	r := e2e.Isopod(t, env, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v:\n%s", args, r)
	}
	return r.JSON
}

// snapshot is one `warmpool list` entry.
type snapshot struct {
	key       string
	memMiB    int
	network   bool
	allocated int64
}

// listSnapshots lists the plain snapshots (not the assembled ones).
func listSnapshots(t *testing.T, env []string) []snapshot {
	t.Helper()
	var out []snapshot
	l, _ := ok(t, env, "warmpool", "list")["snapshots"].([]any)
	for _, e := range l {
		m := e.(map[string]any)
		if m["root_assembled"] == true {
			continue
		}
		out = append(out, snapshot{key: e2e.Str(m, "key"), memMiB: int(m["mem_mib"].(float64)),
			network: m["network"] == true, allocated: int64(m["allocated_bytes"].(float64))})
	}
	return out
}

// assembledKeys are the assembled snapshots' keys.
func assembledKeys(t *testing.T, env []string) []string {
	t.Helper()
	var out []string
	l, _ := ok(t, env, "warmpool", "list")["snapshots"].([]any)
	for _, e := range l {
		if m := e.(map[string]any); m["root_assembled"] == true {
			out = append(out, e2e.Str(m, "key"))
		}
	}
	return out
}

// findSnapshot is the snapshot of a shape, nil when there is none.
func findSnapshot(l []snapshot, memMiB int, network bool) *snapshot {
	for i := range l {
		if l[i].memMiB == memMiB && l[i].network == network {
			return &l[i]
		}
	}
	return nil
}

// stageLayer is the layer file of a stage.
func stageLayer(t *testing.T, env []string, ref string) string {
	t.Helper()
	paths, _ := ok(t, env, "stage", "info", ref)["layer_paths"].([]any)
	if len(paths) == 0 {
		t.Fatalf("stage info %s: no layer paths", ref)
	}
	return paths[len(paths)-1].(string)
}

// layerID computes a stage id from a layer file the way the README
// defines it, independently of the store's code: BLAKE3 over a domain, the
// parent, the base flavor, the size and every non-zero 4 KiB block with
// its offset.
func layerID(t *testing.T, path, parent, flavor string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	h := blake3.New()
	h.WriteString("isopod-stage-v1\x00" + parent + "\x00" + flavor + "\x00")
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(size))
	h.Write(hdr[:])
	zero := make([]byte, 4096)
	block := make([]byte, 4096)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // no data past off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		for b := data &^ 4095; b < hole; b += 4096 {
			n, err := f.ReadAt(block[:min(4096, size-b)], b)
			if err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if string(block[:n]) == string(zero[:n]) {
				continue
			}
			binary.LittleEndian.PutUint64(hdr[:], uint64(b))
			h.Write(hdr[:])
			h.Write(block[:n])
		}
		off = (hole + 4095) &^ 4095
	}
	sum := h.Sum(nil)
	return "st-" + hex.EncodeToString(sum[:8])
}

func TestWarmShapes(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
	cold := append([]string{"ISOPOD_WARM_POOL=off"}, env...)
	c := newClones()
	ids := map[string]string{} // label: stage id

	commit := func(t *testing.T, what string, args []string, label, cmd string) *e2e.Result {
		t.Helper()
		r, _ := c.run(t, env, what, "warm", false, append(args, "--commit-as", label), cmd)
		if e := e2e.Str(r.JSON, "commit_error"); e != "" || e2e.Str(r.JSON, "stage_id") == "" {
			t.Fatalf("%s: not committed (%s):\n%s", what, e, r.Stdout)
		}
		ids[label] = e2e.Str(r.JSON, "stage_id")
		return r
	}

	t.Run("a fork of a three-layer stage resumes and sees every layer", func(t *testing.T) {
		c.run(t, env, "the first base run", "cold", true, nil, "true")
		commit(t, "commit of layer 1", nil, "l1", "mkdir -p /opt && echo one > /opt/l1 && echo doomed > /opt/l1b")
		commit(t, "commit of layer 2", []string{"--stage", "l1"}, "l2", "echo two > /opt/l2")
		commit(t, "commit of layer 3", []string{"--stage", "l2"}, "l3", "echo three > /opt/l3 && rm /opt/l1b")
		r, out := c.run(t, env, "fork of l3", "warm", false, []string{"--stage", "l3"},
			"cat /opt/l1 /opt/l2 /opt/l3; test ! -e /opt/l1b && echo whiteout")
		if out != "one\ntwo\nthree\nwhiteout\n" {
			t.Errorf("fork of the three-layer stage printed %q; want each layer's file and layer 3's removal", out)
		}
		if got := e2e.Str(r.JSON, "forked_from"); got != ids["l3"] {
			t.Errorf("forked_from %q; want %q", got, ids["l3"])
		}
		chain, _ := ok(t, env, "stage", "info", "l3")["chain"].([]any)
		if len(chain) != 3 {
			t.Errorf("l3's chain has %d stages; want 3", len(chain))
		}
	})

	t.Run("a warm networked run has the run's resolver", func(t *testing.T) {
		// The snapshot VM configured its NIC before the run's root was
		// mounted; the root a clone mounts must name the gateway's DNS too,
		// as a cold boot's does.
		// The third run of the shape: it builds the shape's assembled
		// snapshot, whose VM configured its NIC before mounting the root.
		r, out := c.run(t, env, "resolver run", "warm", true, nil, "cat /etc/resolv.conf")
		if r.JSON["root_assembled"] != true {
			t.Errorf("the third run of the default shape did not resume with its root assembled:\n%s", r.Stdout)
		}
		if !strings.Contains(out, "nameserver 10.0.2.1\n") {
			t.Errorf("a warm run's /etc/resolv.conf is %q; want the gateway's resolver, nameserver 10.0.2.1", out)
		}
	})

	t.Run("another memory size gets its own snapshot", func(t *testing.T) {
		for i, built := range []bool{true, false} {
			_, out := c.run(t, env, fmt.Sprintf("--mem-mib 256 run %d", i), firstCold(built), built, []string{"--mem-mib", "256"},
				"sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo")
			if kb, err := strconv.Atoi(strings.TrimSpace(out)); err != nil || kb > 256<<10 || kb < 160<<10 {
				t.Errorf("--mem-mib 256 guest has MemTotal %q kB", out)
			}
		}
		if l := listSnapshots(t, env); len(l) != 2 || findSnapshot(l, 256, true) == nil {
			t.Errorf("snapshots %+v; want the default shape's and a 256 MiB one", l)
		}
	})

	t.Run("--no-network resumes with only lo", func(t *testing.T) {
		for i, built := range []bool{true, false} {
			r, out := c.run(t, env, fmt.Sprintf("--no-network run %d", i), firstCold(built), built, []string{"--no-network"}, "ls /sys/class/net")
			if out != "lo\n" {
				t.Errorf("--no-network run %d has interfaces %q; want only lo", i, out)
			}
			if r.JSON["guest_ip"] != nil || r.JSON["net"] != nil {
				t.Errorf("--no-network run %d reports a network:\n%s", i, r.Stdout)
			}
		}
		if l := listSnapshots(t, env); len(l) != 3 || findSnapshot(l, 512, false) == nil {
			t.Errorf("snapshots %+v; want a NIC-less one besides", l)
		}
	})

	t.Run("filtered egress resumes", func(t *testing.T) {
		r, out := c.run(t, env, "--deny-egress run", "warm", false, []string{"--deny-egress"},
			"nslookup example.com >/dev/null 2>&1 && echo resolved || echo refused; ls /sys/class/net | tr '\\n' ' '")
		if out != "refused\neth0 lo " {
			t.Errorf("--deny-egress run printed %q; want the name refused and eth0 lo", out)
		}
		if r.JSON["egress"] == nil {
			t.Errorf("--deny-egress run has no egress record:\n%s", r.Stdout)
		}
	})

	t.Run("a warm commit reads back cold, and its id is its bytes'", func(t *testing.T) {
		// The same files with the same times, committed warm and cold.
		const det = "mkdir -p /opt/det && printf 'same bytes\\n' > /opt/det/f && touch -d @0 /opt/det/f /opt/det /opt"
		if r := commit(t, "deterministic warm commit", nil, "det-warm", det); r.JSON["root_assembled"] != true {
			t.Errorf("the warm commit did not resume from the default shape's assembled snapshot:\n%s", r.Stdout)
		}
		before := time.Now()
		r := warmRun(t, cold, append([]string{"--commit-as", "det-cold", "--"}, hygienic(det)...)...)
		wantPath(t, r, "cold", false)
		c.check(t, "deterministic cold commit", r, before, time.Now())
		ids["det-cold"] = e2e.Str(r.JSON, "stage_id")

		before = time.Now()
		r = warmRun(t, cold, append([]string{"--stage", "det-warm", "--"}, hygienic("cat /opt/det/f; stat -c %Y /opt/det/f")...)...)
		wantPath(t, r, "cold", false)
		if out := c.check(t, "cold fork of the warm commit", r, before, time.Now()); out != "same bytes\n0\n" {
			t.Errorf("a cold fork of the warm commit printed %q", out)
		}
		// The two layers hold the same tree...
		d := ok(t, env, "stage", "diff", "det-cold", "det-warm")
		for _, k := range []string{"added", "changed", "removed"} {
			if l, _ := d[k].([]any); len(l) != 0 {
				t.Errorf("stage diff of the cold and the warm commit: %s %v", k, l)
			}
		}
		// ...and each id is the hash of its layer's bytes, whichever path
		// made it: the same bytes give the same id. (Two commits are not
		// byte-identical: ext4 stamps inode change and mount times and a
		// random inode generation.)
		for _, label := range []string{"det-warm", "det-cold"} {
			if got := layerID(t, stageLayer(t, env, label), "", "base-min"); got != ids[label] {
				t.Errorf("%s: the layer's bytes hash to %s; the stage id is %s", label, got, ids[label])
			}
		}
		if ids["det-warm"] == ids["det-cold"] {
			t.Logf("the warm and cold commits are byte-identical (%s)", ids["det-warm"])
		}
	})

	t.Run("two warm commits on forks of one stage at once", func(t *testing.T) {
		before := time.Now()
		rs := e2e.Parallel(2, func(i int) *e2e.Result {
			return e2e.Isopod(t, env, append([]string{"run", "--stage", "l1", "--commit-as", "par-" + strconv.Itoa(i), "--"},
				hygienic(fmt.Sprintf("echo %d > /opt/par", i))...)...)
		})
		after := time.Now()
		for i, r := range rs {
			what := fmt.Sprintf("parallel commit %d", i)
			if r.Code != 0 || r.JSON["ok"] != true || e2e.Num(t, r.JSON, "exit_code") != 0 {
				t.Fatalf("%s:\n%s", what, r)
			}
			// l1 recurs: one of them may build its assembled snapshot.
			wantPath(t, r, "warm", r.JSON["snapshot_built"] == true && r.JSON["root_assembled"] == true)
			c.check(t, what, r, before, after)
			if e := e2e.Str(r.JSON, "commit_error"); e != "" || e2e.Str(r.JSON, "stage_id") == "" {
				t.Fatalf("%s: not committed (%s)", what, e)
			}
			label := "par-" + strconv.Itoa(i)
			ids[label] = e2e.Str(r.JSON, "stage_id")
			info := ok(t, env, "stage", "info", label)
			if st, _ := info["stage"].(map[string]any); st == nil || st["parent"] != ids["l1"] {
				t.Errorf("%s: parent %v; want l1 %s", label, info["stage"], ids["l1"])
			}
			d := ok(t, env, "stage", "diff", "l1", label)
			added, _ := d["added"].([]any)
			if len(added) != 1 || !strings.Contains(fmt.Sprint(added[0]), "/opt/par") {
				t.Errorf("stage diff l1 %s: added %v; want /opt/par", label, added)
			}
		}
		if ids["par-0"] == ids["par-1"] {
			t.Errorf("two commits of different files have one id %s", ids["par-0"])
		}
	})

	t.Run("the budget evicts the least recently used snapshot", func(t *testing.T) {
		// The assembled snapshots go first; of the plain ones, used last:
		// the 256 MiB shape, then --no-network, then the default (the
		// fallback of the assembled ones, as recently used as they).
		for _, k := range assembledKeys(t, env) {
			ok(t, env, "warmpool", "rm", k)
		}
		l := listSnapshots(t, env)
		def, nonet, small := findSnapshot(l, 512, true), findSnapshot(l, 512, false), findSnapshot(l, 256, true)
		if len(l) != 3 || def == nil || nonet == nil || small == nil {
			t.Fatalf("snapshots %+v; want the default, --no-network and 256 MiB shapes", l)
		}
		// Room for all but the least recently used once a fourth shape of
		// about its size (256 MiB, no NIC) is built: a budget it overflows
		// and that holds it after one eviction (its size between half and
		// one and a half times the evicted one's).
		budget := int64(math.Ceil(float64(def.allocated+nonet.allocated+small.allocated*3/2) / (1 << 20)))
		b := ok(t, append([]string{"ISOPOD_WARM_POOL_DISK_MIB=" + strconv.FormatInt(budget, 10)}, env...),
			"warmpool", "build", "--mem-mib", "256", "--no-network")
		if b["built"] != true {
			t.Fatalf("warmpool build --mem-mib 256 --no-network did not build: %v", b)
		}
		l = listSnapshots(t, env)
		if findSnapshot(l, 256, true) != nil || findSnapshot(l, 256, false) == nil ||
			findSnapshot(l, 512, true) == nil || findSnapshot(l, 512, false) == nil {
			t.Errorf("after a build over the budget (%d MiB), snapshots %+v; want the 256 MiB NIC one (least recently used) gone", budget, l)
		}
		if _, err := os.Stat(filepath.Join(home, "snapshots", small.key)); err == nil {
			t.Errorf("the evicted snapshot's directory is still there")
		}
		// The evicted shape rebuilds on its next run (its third: its
		// assembled snapshot, booted, since its plain one is gone too).
		c.run(t, env, "run of the evicted shape", "cold", true, []string{"--mem-mib", "256"}, "true")
		c.run(t, env, "run of the built shape", "warm", false, []string{"--mem-mib", "256", "--no-network"}, "true")
	})

	t.Run("a removed stage is refused and used by nothing", func(t *testing.T) {
		if ids["l3"] == "" {
			t.Skip("no three-layer stage")
		}
		ok(t, env, "stage", "rm", "l3")
		e2e.RunFail(t, env, "l3", "run", "--stage", "l3", "--", "true")
		e2e.RunFail(t, env, ids["l3"], "run", "--stage", ids["l3"], "--", "true")
		if _, err := os.Stat(filepath.Join(home, "stages", ids["l3"])); err == nil {
			t.Errorf("the removed stage's directory is still there")
		}
		// Its parent is whole and shows nothing of it: l1b is back.
		_, out := c.run(t, env, "fork of l2 after l3's removal", "warm", false, []string{"--stage", "l2"},
			"test ! -e /opt/l3 && cat /opt/l2 /opt/l1b")
		if out != "two\ndoomed\n" {
			t.Errorf("a fork of l2 after removing l3 printed %q", out)
		}
		vms, _ := ok(t, env, "vm", "ls")["vms"].([]any)
		for _, v := range vms {
			if m := v.(map[string]any); m["live"] == true {
				t.Errorf("a VM is live after every run ended: %v", m)
			}
		}
	})
}
