// Package hostiotest builds the host trees that host-I/O confinement is
// tested against: a root holding a state directory, a sibling outside it,
// and every kind of link and special file a confined path may meet. The
// host-I/O package and the MCP server test against the same tree.
package hostiotest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Tree is a confinement fixture: a root holding the state directory (as
// when the server runs in a home directory), and a sibling outside it.
type Tree struct {
	Base, Root, Outside, Home string
	Secret                    string // Outside/secret.txt
}

// NewTree lays the fixture out in a temporary directory. The root holds
// ok.txt, big (5 MiB), exact (stdinCap bytes, the largest stdin file
// allowed), a FIFO, a hard link to a file outside, and symlinks in, out,
// dangling and looping.
func NewTree(t *testing.T, stdinCap int) Tree {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := Tree{Base: base, Root: filepath.Join(base, "root"), Outside: filepath.Join(base, "outside")}
	h.Home = filepath.Join(h.Root, ".isopod")
	h.Secret = filepath.Join(h.Outside, "secret.txt")
	for _, d := range []string{h.Root, h.Outside, h.Home, filepath.Join(h.Root, "sub")} {
		MustMkdir(t, d)
	}
	MustWrite(t, h.Secret, "secret")
	MustWrite(t, filepath.Join(h.Outside, "linked.txt"), "linked")
	MustWrite(t, filepath.Join(h.Home, "credentials.json"), "{}")
	MustWrite(t, filepath.Join(h.Root, "ok.txt"), "hello from the host\n")
	MustWrite(t, filepath.Join(h.Root, "big"), strings.Repeat("x", 5<<20))
	MustWrite(t, filepath.Join(h.Root, "exact"), strings.Repeat("y", stdinCap))
	links := map[string]string{
		"out-link":    h.Secret,
		"outdir-link": h.Outside,
		"dangling":    filepath.Join(h.Outside, "not-yet"),
		"in-link":     filepath.Join(h.Root, "ok.txt"),
		"home-link":   h.Home,
		"loop":        filepath.Join(h.Root, "loop"),
		"in-dangling": filepath.Join(h.Root, "not-yet"),
		"rel-link":    "sub/../ok.txt",
		"rel-out":     "../outside/secret.txt",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(h.Root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(h.Root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(h.Outside, "linked.txt"), filepath.Join(h.Root, "hard")); err != nil {
		t.Fatal(err)
	}
	return h
}

// MustMkdir makes d and its parents.
func MustMkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

// MustWrite writes s to p.
func MustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Snapshot records every name and content under dir, so a test can show
// a refused call left it untouched.
func Snapshot(t *testing.T, dir string) map[string]string {
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

// SameSnapshot fails t where after differs from before.
func SameSnapshot(t *testing.T, before, after map[string]string) {
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
