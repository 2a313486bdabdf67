package hosttool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// program writes an executable named name in dir and returns its path.
func program(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFind: PATH comes first, then the system directories a user's PATH
// lacks; a file that is not executable, a directory and a relative PATH
// entry are passed over; a name with a slash is taken as it is.
func TestFind(t *testing.T) {
	onPath, sbin, other := t.TempDir(), t.TempDir(), t.TempDir()
	both := program(t, onPath, "both", 0o755)
	program(t, sbin, "both", 0o755)
	inSbin := program(t, sbin, "only-sbin", 0o755)
	program(t, onPath, "not-exec", 0o644)
	sbinExec := program(t, sbin, "not-exec", 0o755)
	if err := os.Mkdir(filepath.Join(onPath, "a-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	program(t, other, "in-cwd", 0o755)
	if err := os.Mkdir(filepath.Join(other, "rel"), 0o755); err != nil {
		t.Fatal(err)
	}
	program(t, filepath.Join(other, "rel"), "in-rel", 0o755)
	path := "rel:" + onPath + "::"
	for _, tt := range []struct {
		name, want string
	}{
		{"both", both},
		{"only-sbin", inSbin},
		{"not-exec", sbinExec},
		{inSbin, inSbin},
		{"a-dir", ""},
		{"in-cwd", ""},
		{"in-rel", ""},
		{"nowhere", ""},
	} {
		got, err := find(tt.name, path, []string{sbin})
		if got != tt.want || (tt.want == "") != (err != nil) {
			t.Errorf("find(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	if _, err := find(filepath.Join(onPath, "not-exec"), path, nil); !errors.Is(err, ErrNotExecutable) {
		t.Errorf("a path to a file that is not executable: %v", err)
	}
}

// TestFindOnDebianUserPath: with the PATH a normal user has on Debian (no
// sbin), e2fsprogs' programs are still found where they are installed.
func TestFindOnDebianUserPath(t *testing.T) {
	t.Setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
	for _, name := range []string{"mkfs.ext4", "debugfs"} {
		var installed string
		for _, d := range systemDirs {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				installed = filepath.Join(d, name)
				break
			}
		}
		if installed == "" {
			t.Logf("%s is not installed in %v here", name, systemDirs)
			continue
		}
		if got, err := Find(name); err != nil || got != installed {
			t.Errorf("Find(%q) = %q, %v; want %s", name, got, err, installed)
		}
	}
}

// TestMissing: a missing program's error says where it was looked for
// (PATH, and the system directories PATH does not hold) and the package
// that installs it, and is a failed precondition.
func TestMissing(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, tt := range []struct {
		name, path string
		dirs       []string
		says       []string
		not        []string
	}{
		{"mkfs.ext4", "/nonexistent/bin:" + a, []string{a, b},
			[]string{"mkfs.ext4 not found on PATH (/nonexistent/bin:" + a + ") or in " + b + ":",
				"install e2fsprogs", "`apt-get install e2fsprogs`", "`dnf install e2fsprogs`"},
			[]string{a + ", "}},
		{"newuidmap", a, []string{b},
			[]string{"newuidmap not found on PATH (" + a + ") or in " + b, "`apt-get install uidmap`", "`dnf install shadow-utils`"}, nil},
		{"apt-get", a, nil,
			[]string{"apt-get not found on PATH (" + a + "): install apt (Debian, Ubuntu: `apt-get install apt`)"}, []string{"dnf"}},
		{"mksquashfs", "", []string{b},
			[]string{"mksquashfs not found on PATH (empty) or in " + b, "squashfs-tools"}, nil},
		{"frobnicate", a, nil, []string{"frobnicate not found", "install it, or put the directory that holds it on PATH"}, nil},
	} {
		_, err := find(tt.name, tt.path, tt.dirs)
		var m *MissingError
		if !errors.As(err, &m) || m.Name != tt.name || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v; want a *MissingError, a failed precondition", tt.name, err)
			continue
		}
		for _, s := range tt.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", tt.name, err, s)
			}
		}
		for _, s := range tt.not {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q says %q", tt.name, err, s)
			}
		}
	}
}
