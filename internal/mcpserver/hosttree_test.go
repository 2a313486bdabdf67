package mcpserver

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/hostio"
)

// hostTree is a confinement fixture (as internal/hostio's tests use): a root holding the state directory (as
// when the server runs in a home directory), and a sibling outside it.
type hostTree struct {
	base, root, outside, home string
	secret                    string // outside/secret.txt
}

func newHostTree(t *testing.T) hostTree {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := hostTree{
		base:    base,
		root:    filepath.Join(base, "root"),
		outside: filepath.Join(base, "outside"),
	}
	h.home = filepath.Join(h.root, ".isopod")
	h.secret = filepath.Join(h.outside, "secret.txt")
	for _, d := range []string{h.root, h.outside, h.home, filepath.Join(h.root, "sub")} {
		mustMkdir(t, d)
	}
	mustWrite(t, h.secret, "secret")
	mustWrite(t, filepath.Join(h.outside, "linked.txt"), "linked")
	mustWrite(t, filepath.Join(h.home, "credentials.json"), "{}")
	mustWrite(t, filepath.Join(h.root, "ok.txt"), "hello from the host\n")
	mustWrite(t, filepath.Join(h.root, "big"), strings.Repeat("x", 5<<20))
	mustWrite(t, filepath.Join(h.root, "exact"), strings.Repeat("y", hostio.MaxStdinFileBytes))
	links := map[string]string{
		"out-link":    h.secret,
		"outdir-link": h.outside,
		"dangling":    filepath.Join(h.outside, "not-yet"),
		"in-link":     filepath.Join(h.root, "ok.txt"),
		"home-link":   h.home,
		"loop":        filepath.Join(h.root, "loop"),
		"in-dangling": filepath.Join(h.root, "not-yet"),
		"rel-link":    "sub/../ok.txt",
		"rel-out":     "../outside/secret.txt",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(h.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(h.root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(h.outside, "linked.txt"), filepath.Join(h.root, "hard")); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h hostTree) policy() hostio.Policy {
	return hostio.Policy{Root: h.root, Home: h.home, StdinFile: true, CopyOut: true}
}

func mustMkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// snapshotDir records every name and content under dir, so a test can show
// a refused call left it untouched.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += ":" + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(t *testing.T, before, after map[string]string) {
	t.Helper()
	if len(before) != len(after) {
		t.Errorf("directory changed: %d entries before, %d after", len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed", k)
		}
	}
}
