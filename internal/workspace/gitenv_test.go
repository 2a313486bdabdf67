//go:build linux

package workspace

import (
	"os"
	"path/filepath"
	"testing"
)

// The repository's config cannot make the host run a command while the
// tree is listed and patched (core.fsmonitor names one), and the caller's
// GIT_* environment cannot point git at another repository.
func TestGitRunsNothingOfTheRepository(t *testing.T) {
	repo, _ := fixture(t)
	marker := filepath.Join(t.TempDir(), "ran")
	hook := filepath.Join(t.TempDir(), "fsmonitor.sh")
	write(t, hook, "#!/bin/sh\ntouch "+marker+"\n", 0o755)
	gitIn(t, repo, "config", "core.fsmonitor", hook)
	other := t.TempDir()
	gitIn(t, other, "init", "-q")
	write(t, filepath.Join(other, "elsewhere.txt"), "not in the workspace\n", 0o644)
	gitIn(t, other, "add", "elsewhere.txt")
	t.Setenv("GIT_DIR", filepath.Join(other, ".git"))
	t.Setenv("GIT_WORK_TREE", other)

	tr := mustPack(t, repo, Options{})
	got := unpack(t, tr.Image)
	if _, err := os.Stat(filepath.Join(got, "elsewhere.txt")); err == nil {
		t.Errorf("GIT_DIR from the environment chose the files")
	}
	if _, err := os.Stat(filepath.Join(got, "README.md")); err != nil {
		t.Errorf("the workspace's own files are missing: %v", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the repository's core.fsmonitor command ran on the host")
	}
}
