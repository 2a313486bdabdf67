package sessions

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"isopod/integration/e2e"
)

// A resumed session's guest RAM is a file of its own in its VM's
// directory, mapped shared by its QEMU, which reaches it by no path (the
// jail's root has none of the host's). A pause takes that file in place
// as its snapshot's RAM and a resume maps it again: the same file before
// the pause and after the resume, and no other file of RAM's size
// written.
func TestSessionPauseRAMInPlace(t *testing.T) {
	e2e.RequireVM(t)
	const memMiB = 320
	id, _ := start(t, "--no-network", "--mem-mib", strconv.Itoa(memMiB))
	isopod(t, "session", "exec", id, "--shell", "--", "echo 7 > /tmp/mark")
	// The first pause copies RAM out of the memory a session starts with;
	// its resume gives the VM its RAM file.
	pause(t, id)
	if got, resumed := guestInts(t, id, "cat /tmp/mark"); !resumed || len(got) != 1 || got[0] != 7 {
		t.Fatalf("after the first resume: %v (resumed %v); want 7", got, resumed)
	}
	rec := readRecord(t, id)
	vmDir := filepath.Join(e2e.HomeDir, "vms", rec.VMID)
	ram := filepath.Join(vmDir, "ram")
	before, err := os.Stat(ram)
	if err != nil {
		t.Fatalf("the resumed VM's RAM file: %v", err)
	}
	checkJailedRAM(t, rec.VMID, ram)

	pause(t, id)
	sessDir := filepath.Join(e2e.HomeDir, "sessions", id)
	if mem, err := os.Stat(filepath.Join(sessDir, "paused", "memory")); err != nil || !os.SameFile(before, mem) {
		t.Errorf("the pause's RAM is not the VM's RAM file (%v)", err)
	}
	for _, dir := range []string{sessDir, vmDir} {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if st, err := os.Stat(path); err == nil && st.Size() == memMiB<<20 && !os.SameFile(st, before) {
				t.Errorf("the pause wrote %s, a file of RAM's size besides the RAM file", path)
			}
			return nil
		})
	}
	if got, resumed := guestInts(t, id, "cat /tmp/mark"); !resumed || len(got) != 1 || got[0] != 7 {
		t.Fatalf("after the second resume: %v (resumed %v); want 7", got, resumed)
	}
	if after, err := os.Stat(ram); err != nil || !os.SameFile(before, after) {
		t.Errorf("the RAM file after the resume is another (%v); want the same file", err)
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
