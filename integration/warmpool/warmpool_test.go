package warmpool

import (
	"isopod/integration/e2e"

	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// warmHome is a state root of its own (the warm pool's cache state matters
// here) sharing the kernels and base-min of the real one.
func warmHome(t *testing.T) []string {
	t.Helper()
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "images"), 0o700)
	if err := os.Symlink(filepath.Join(e2e.HomeDir, "kernels"), filepath.Join(home, "kernels")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"base-min.sqfs", "base-min.json", "initramfs.cpio", "initramfs.json"} {
		b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "images", f))
		if err != nil {
			t.Skipf("%s not built under %s: run ./scripts/install.sh", f, e2e.HomeDir)
		}
		os.WriteFile(filepath.Join(home, "images", f), b, 0o600)
	}
	// The accelerator probe's outcome, so the first run does not redo it.
	if b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "accel-probe.json")); err == nil {
		os.WriteFile(filepath.Join(home, "accel-probe.json"), b, 0o600)
	}
	return []string{"ISOPOD_HOME=" + home}
}

// warmRun is `isopod run` in env that must succeed.
func warmRun(t *testing.T, env []string, args ...string) *e2e.Result {
	t.Helper()
	r := e2e.Isopod(t, env, append([]string{"run"}, args...)...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run %v failed:\n%s", args, r)
	}
	if c := e2e.Num(t, r.JSON, "exit_code"); c != 0 {
		t.Fatalf("isopod run %v: exit %d:\n%s", args, c, r)
	}
	return r
}

// wantPath checks the report's path and whether it built a snapshot.
func wantPath(t *testing.T, r *e2e.Result, path string, built bool) {
	t.Helper()
	if got := e2e.Str(r.JSON, "path"); got != path {
		t.Errorf("path: got %q; want %q\n%s", got, path, r.Stdout)
	}
	if got := r.JSON["snapshot_built"] == true; got != built {
		t.Errorf("snapshot_built: got %v; want %v\n%s", got, built, r.Stdout)
	}
	if built {
		e2e.Num(t, r.JSON, "snapshot_build_ms")
	}
	if path == "warm" {
		e2e.Num(t, r.JSON, "resume_ms")
	}
}

func snapshotDirs(t *testing.T, env []string) []string {
	t.Helper()
	home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
	ents, _ := os.ReadDir(filepath.Join(home, "snapshots"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestWarmPool(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)

	t.Run("first run builds, second resumes", func(t *testing.T) {
		// The first run boots the snapshot VM, snapshots it and runs on in
		// it: cold, with the build in its report, made its own as a clone.
		ownHost := "hostname; ping -c 1 -W 5 10.0.2.1 >/dev/null && echo gateway"
		r := warmRun(t, env, "--", "sh", "-c", "echo one > /root/first; cat /root/first; "+ownHost)
		wantPath(t, r, "cold", true)
		e2e.Num(t, r.JSON, "boot_ms")
		if got := e2e.Str(r.JSON, "stdout"); got != "one\n"+e2e.Str(r.JSON, "name")+"\ngateway\n" {
			t.Errorf("first run stdout %q; want one, its own hostname %s, gateway", got, e2e.Str(r.JSON, "name"))
		}
		// Its own hostname, a writable root without the first run's file,
		// and a NIC that reaches its own network's gateway.
		r = warmRun(t, env, "--", "sh", "-c", "test ! -e /root/first; echo two > /root/f; cat /root/f; "+ownHost)
		wantPath(t, r, "warm", false)
		if got := e2e.Str(r.JSON, "stdout"); got != "two\n"+e2e.Str(r.JSON, "name")+"\ngateway\n" {
			t.Errorf("warm run stdout %q; want two, its own hostname %s, gateway", got, e2e.Str(r.JSON, "name"))
		}
		if e2e.Str(r.JSON, "guest_ip") == "" {
			t.Errorf("warm run has no guest_ip: %s", r.Stdout)
		}
		// A resumed VM never sees an earlier run's writes. The shape
		// recurs: this third run builds its assembled snapshot and
		// resumes from it.
		r = warmRun(t, env, "--", "sh", "-c", "test ! -e /root/f && echo clean")
		wantPath(t, r, "warm", true)
		if r.JSON["root_assembled"] != true {
			t.Errorf("the third run of a shape did not resume with its root assembled:\n%s", r.Stdout)
		}
		if e2e.Str(r.JSON, "stdout") != "clean\n" {
			t.Errorf("a warm run saw an earlier run's file: %q", e2e.Str(r.JSON, "stdout"))
		}
	})

	t.Run("other scratch sizes, commits and forks resume from the same snapshot", func(t *testing.T) {
		// --no-network and other memory sizes are other shapes, with
		// snapshots of their own (shapes_test.go).
		label := "warm-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		for _, args := range [][]string{
			{"--scratch-mib", "256"},
			{"--commit-as", label},
			{"--stage", label},
		} {
			r := warmRun(t, env, append(args, "--", "true")...)
			wantPath(t, r, "warm", false)
		}
	})

	t.Run("clone safety across parallel resumes", func(t *testing.T) {
		before := time.Now()
		results := e2e.Parallel(3, func(int) *e2e.Result {
			return e2e.Isopod(t, env, "run", "--", "sh", "-c",
				"cat /proc/sys/kernel/random/uuid; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; cat /proc/sys/kernel/random/boot_id; touch /tmp/now; stat -c %Y.%y /tmp/now")
		})
		after := time.Now()
		seen := map[string]int{}
		for i, r := range results {
			if r.Code != 0 || e2e.Str(r.JSON, "path") != "warm" {
				t.Fatalf("parallel resume %d:\n%s", i, r)
			}
			lines := strings.Split(strings.TrimSpace(e2e.Str(r.JSON, "stdout")), "\n")
			if len(lines) != 4 || len(lines[0]) != 36 || len(lines[1]) != 64 || len(lines[2]) != 36 {
				t.Fatalf("run %d output: %q", i, lines)
			}
			// A fresh UUID, fresh random bytes and a boot ID of its own
			// (the kernel makes it on first read, after the reseed).
			for _, v := range lines[:3] {
				if j, dup := seen[v]; dup {
					t.Errorf("runs %d and %d resumed from one snapshot share %q", j, i, v)
				}
				seen[v] = i
			}
			// %Y is whole seconds; the fraction comes from %y's nanoseconds.
			secs, _, _ := strings.Cut(lines[3], ".")
			s, err := strconv.ParseInt(secs, 10, 64)
			frac := ""
			if f := strings.Fields(lines[3]); len(f) >= 2 {
				_, frac, _ = strings.Cut(f[1], ".")
			}
			ns, _ := strconv.ParseInt(frac, 10, 64)
			if err != nil {
				t.Fatalf("guest clock %q: %v", lines[3], err)
			}
			guest := time.Unix(s, ns)
			if guest.Before(before.Add(-time.Second)) || guest.After(after.Add(time.Second)) {
				t.Errorf("run %d: guest clock %v outside the run's window [%v, %v] by more than a second", i, guest, before, after)
			}
		}
	})

	t.Run("another memory size rebuilds once", func(t *testing.T) {
		r := warmRun(t, env, "--mem-mib", "256", "--", "true")
		wantPath(t, r, "cold", true)
		r = warmRun(t, env, "--mem-mib", "256", "--", "true")
		wantPath(t, r, "warm", false)
		b := e2e.Isopod(t, env, "warmpool", "build", "--mem-mib", "256")
		if b.Code != 0 || b.JSON["built"] != false {
			t.Errorf("warmpool build of a current snapshot:\n%s", b)
		}
		l := e2e.Isopod(t, env, "warmpool", "list")
		snaps, _ := l.JSON["snapshots"].([]any)
		if l.Code != 0 || len(snaps) != 3 {
			t.Errorf("warmpool list: want 3 snapshots (the default shape's, its assembled one, 256 MiB):\n%s", l)
		}
	})

	t.Run("rm --all then a run rebuilds", func(t *testing.T) {
		rm := e2e.Isopod(t, env, "warmpool", "rm", "--all")
		if removed, _ := rm.JSON["removed"].([]any); rm.Code != 0 || len(removed) != 3 {
			t.Fatalf("warmpool rm --all:\n%s", rm)
		}
		if d := snapshotDirs(t, env); len(d) != 0 {
			t.Errorf("left after rm --all: %v", d)
		}
		// Two eligible runs at once: one builds, the other does not race
		// it (it boots cold, or resumes if the build was already done).
		results := e2e.Parallel(2, func(int) *e2e.Result { return e2e.Isopod(t, env, "run", "--", "true") })
		built := 0
		for i, r := range results {
			if r.Code != 0 || r.JSON["ok"] != true {
				t.Fatalf("run %d:\n%s", i, r)
			}
			if r.JSON["snapshot_built"] == true {
				built++
			}
		}
		if built != 1 {
			t.Errorf("%d of 2 concurrent runs built the snapshot; want 1:\n%s\n%s", built, results[0].Stdout, results[1].Stdout)
		}
	})

	t.Run("corrupt snapshot is rebuilt", func(t *testing.T) {
		dirs := snapshotDirs(t, env)
		if len(dirs) != 1 {
			t.Fatalf("snapshots: %v", dirs)
		}
		home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
		state := filepath.Join(home, "snapshots", dirs[0], "state")
		if err := os.WriteFile(state, []byte("this is not a migration stream\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// Another scratch size: a shape that keeps to the plain snapshot.
		r := warmRun(t, env, "--scratch-mib", "256", "--", "echo", "still fine")
		wantPath(t, r, "cold", true)
		warns, _ := r.JSON["warnings"].([]any)
		if len(warns) == 0 || !strings.Contains(warns[0].(string), "could not be resumed") {
			t.Errorf("no warning about the unusable snapshot: %v", r.JSON["warnings"])
		}
		if e2e.Str(r.JSON, "stdout") != "still fine\n" {
			t.Errorf("stdout %q", e2e.Str(r.JSON, "stdout"))
		}
		wantPath(t, warmRun(t, env, "--scratch-mib", "256", "--", "true"), "warm", false)
	})

	t.Run("vm gc removes leftovers", func(t *testing.T) {
		home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
		for _, name := range []string{".tmp-wk-0000000000000000-abcd1234", ".old-wk-0000000000000000-abcd1234"} {
			os.MkdirAll(filepath.Join(home, "snapshots", name), 0o700)
			os.WriteFile(filepath.Join(home, "snapshots", name, "memory"), []byte("x"), 0o600)
		}
		if r := e2e.Isopod(t, env, "vm", "gc"); r.Code != 0 {
			t.Fatalf("vm gc:\n%s", r)
		}
		d := snapshotDirs(t, env)
		if len(d) != 1 || !strings.HasPrefix(d[0], "wk-") {
			t.Errorf("after gc: %v; want only the current snapshot", d)
		}
	})
}
