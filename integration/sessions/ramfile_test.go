package sessions

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"isopod/integration/e2e"
)

// A session's guest RAM is a file of its own in its VM's directory from
// its start, cold-booted (a new sparse file) or warm-started (a copy of
// the warm pool's snapshot RAM, which stays the pool's), mapped shared by
// its QEMU, which reaches it by no path (the jail's root has none of the
// host's). Every pause, the first too, takes that file in place as its
// snapshot's RAM and a resume maps it again: the same file before the
// pause and after the resume, and no other file of RAM's size written.
func TestSessionPauseRAMInPlace(t *testing.T) {
	e2e.RequireVM(t)
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		path  string
		again bool // pause and resume a second time
	}{
		{"cold", cold, []string{"--no-network", "--mem-mib", "320"}, "cold", true},
		// The shape of TestSessionWarmPause's, whose snapshot it shares.
		{"warm", nil, []string{"--no-network"}, "warm", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, _ := startEnv(t, tc.env, tc.args...)
			rec := readRecord(t, id)
			if rec.Path != tc.path {
				t.Fatalf("the session started %s; want %s", rec.Path, tc.path)
			}
			isopod(t, "session", "exec", id, "--shell", "--", "echo 7 > /tmp/mark")
			ram := filepath.Join(e2e.HomeDir, "vms", rec.VMID, "ram")
			before, err := os.Stat(ram)
			if err != nil {
				t.Fatalf("the started VM's RAM file: %v", err)
			}
			if st, ok := before.Sys().(*syscall.Stat_t); !ok || st.Nlink != 1 {
				t.Errorf("the started VM's RAM file has other names (%+v); want a file of its own", before.Sys())
			}
			checkJailedRAM(t, rec.VMID, ram)
			rounds := 1
			if tc.again {
				rounds = 2
			}
			for i := range rounds {
				pauseInPlace(t, id, rec.VMID, before)
				if got, resumed := guestInts(t, id, "cat /tmp/mark"); !resumed || len(got) != 1 || got[0] != 7 {
					t.Fatalf("after resume %d: %v (resumed %v); want 7", i+1, got, resumed)
				}
				if after, err := os.Stat(ram); err != nil || !os.SameFile(before, after) {
					t.Errorf("the RAM file after resume %d is another (%v); want the same file", i+1, err)
				}
			}
		})
	}
}

// pauseInPlace pauses session id, whose VM vm has the RAM file ram, and
// checks that the pause's RAM is that file and that no other file of its
// size was written.
func pauseInPlace(t *testing.T, id, vm string, ram os.FileInfo) {
	t.Helper()
	pause(t, id)
	sessDir := filepath.Join(e2e.HomeDir, "sessions", id)
	if mem, err := os.Stat(filepath.Join(sessDir, "paused", "memory")); err != nil || !os.SameFile(ram, mem) {
		t.Errorf("the pause's RAM is not the VM's RAM file (%v)", err)
	}
	for _, dir := range []string{sessDir, filepath.Join(e2e.HomeDir, "vms", vm)} {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if st, err := os.Stat(path); err == nil && st.Size() == ram.Size() && !os.SameFile(st, ram) {
				t.Errorf("the pause wrote %s, a file of RAM's size besides the RAM file", path)
			}
			return nil
		})
	}
}

// checkJailedRAM checks that VM vm's QEMU maps the RAM file ram and
// cannot reach it by its path.
func checkJailedRAM(t *testing.T, vm, ram string) {
	t.Helper()
	pids := e2e.QEMUPIDs(t, vm)
	if len(pids) != 1 {
		t.Fatalf("QEMU of %s: %v", vm, pids)
	}
	proc := "/proc/" + strconv.Itoa(pids[0])
	maps, err := os.ReadFile(proc + "/maps")
	if err != nil || !strings.Contains(string(maps), ram) {
		t.Errorf("QEMU's maps do not show the RAM file %s (%v)", ram, err)
	}
	if _, err := os.Stat(proc + "/root" + ram); err == nil {
		t.Errorf("QEMU reaches its RAM file by the path %s; want only its descriptor", ram)
	}
}
