package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/workspace"
)

// A workspace's copy is made in a private directory on /dev/shm when that
// tmpfs has room, for the run only; the guest is told where to mount it
// and starts there.
func TestWorkspaceCopyOnTmpfs(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join("/dev/shm", fmt.Sprintf("isopod-%d", os.Getuid()))
	// The fake guest's commands run on the host: this one looks at the
	// run's own directory there while the run lives.
	rep := run(t, s, sandbox.Request{NoNetwork: true, Workspace: &workspace.Request{Host: tree, Guest: "/src"},
		Argv: []string{"sh", "-c", "stat -c '%a %n' " + base + "/vm-*"}})
	if want := "700 " + filepath.Join(base, rep.VMID) + "\n"; !strings.Contains(rep.Stdout, want) {
		t.Errorf("during the run: %q; want %q", rep.Stdout, want)
	}
	m := d.Machines()[0]
	st := m.State()
	if st.Mount == nil || st.Mount.Workspace != "/src" {
		t.Errorf("mount %+v; want the workspace at /src", st.Mount)
	}
	if rep.Workspace == nil || rep.Workspace.Files != 1 || rep.Workspace.Guest != "/src" {
		t.Errorf("workspace report %+v; want one file at /src", rep.Workspace)
	}
	s.Wait()
	if _, err := os.Stat(filepath.Join(base, rep.VMID)); !os.IsNotExist(err) {
		t.Errorf("the run's tmpfs directory is left: %v", err)
	}
}

// TestWorkspaceOpenedOnce: the host directory a run copies is the one its
// request was admitted with, opened once: a directory put in its place
// after the check is not what the run copies.
func TestWorkspaceOpenedOnce(t *testing.T) {
	t.Parallel()
	s, _ := newColdService(t, vmmfake.Config{})
	parent := t.TempDir()
	tree := filepath.Join(parent, "ws")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req, release, err := sandbox.Admit(ctx, s, sandbox.Request{NoNetwork: true, Argv: []string{"true"}, Workspace: &workspace.Request{Host: tree}})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// Another directory takes the path once the request is admitted.
	if err := os.Rename(tree, filepath.Join(parent, "checked")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"x", "y", "z"} {
		if err := os.WriteFile(filepath.Join(tree, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep := run(t, s, req)
	if rep.Workspace == nil || rep.Workspace.Files != 1 {
		t.Errorf("workspace report %+v; want the one file of the directory checked", rep.Workspace)
	}
}
