//go:build linux

package jail

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFindHelper: isopod-jail beside the program (through a symlink to
// it) comes first, then the one in its prefix's lib/isopod, then the
// packaged one; one that group or others can
// write, owned by someone else, or not a file is passed over with its
// reason; with none the program re-executes itself.
func TestFindHelper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another owner needs root")
	}
	dir := t.TempDir()
	bin, pkg, links := filepath.Join(dir, "bin"), filepath.Join(dir, "pkg"), filepath.Join(dir, "links")
	prefixed := filepath.Join(dir, "lib", "isopod", helperName)
	for _, d := range []string{bin, pkg, links, filepath.Dir(prefixed)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self := filepath.Join(bin, "isopod")
	write(t, self, 0o755)
	if err := os.Symlink(self, filepath.Join(links, "isopod")); err != nil {
		t.Fatal(err)
	}
	beside, packaged := filepath.Join(bin, helperName), filepath.Join(pkg, helperName)
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T)
		want    string
		skipped string
	}{
		{"none", func(t *testing.T) {}, "", ""},
		{"beside", func(t *testing.T) { write(t, beside, 0o755); write(t, packaged, 0o755) }, beside, ""},
		{"in the prefix", func(t *testing.T) { write(t, prefixed, 0o755); write(t, packaged, 0o755) }, prefixed, ""},
		{"packaged", func(t *testing.T) { write(t, packaged, 0o755) }, packaged, ""},
		{"owned by this user", func(t *testing.T) { write(t, beside, 0o700); chown(t, beside, 4242) }, beside, ""},
		{"group-writable", func(t *testing.T) { write(t, beside, 0o775); write(t, packaged, 0o755) }, packaged, "writable by group or others"},
		{"others-writable", func(t *testing.T) { write(t, beside, 0o757) }, "", "writable by group or others"},
		{"someone else's", func(t *testing.T) { write(t, beside, 0o755); chown(t, beside, 4343) }, "", "owned by uid 4343"},
		{"a directory", func(t *testing.T) { os.Mkdir(beside, 0o755) }, "", "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { os.RemoveAll(beside); os.RemoveAll(prefixed); os.RemoveAll(packaged) })
			tc.setup(t)
			var skipped []string
			got := findHelper(filepath.Join(links, "isopod"), []string{packaged}, 4242, func(p string, err error) {
				skipped = append(skipped, p+": "+err.Error())
			})
			if got != tc.want {
				t.Errorf("helper %q; want %q (passed over: %q)", got, tc.want, skipped)
			}
			if s := strings.Join(skipped, "\n"); tc.skipped == "" && s != "" || !strings.Contains(s, tc.skipped) {
				t.Errorf("passed over %q; want %q", s, tc.skipped)
			}
		})
	}
}

func write(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Chown(path, uid, 0); err != nil {
		t.Fatal(err)
	}
}

// buildHelper builds cmd/isopod-jail, with extra go build flags, into a
// directory of the test's.
func buildHelper(t *testing.T, flags ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), helperName)
	args := append(append([]string{"build", "-o", out}, flags...), "isopod/cmd/isopod-jail")
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot build %s: %v\n%s", helperName, err, b)
	}
	return out
}

// TestDedicatedHelper starts a confined process through the isopod-jail
// program, as an installed isopod does, and finds it as confined as
// through the re-execution; a helper of another build refuses to start
// it and says to reinstall.
func TestDedicatedHelper(t *testing.T) {
	j := newTestJailer(t)
	if j.Helper() != "" {
		t.Fatalf("the test binary found the helper %s; want the re-execution", j.Helper())
	}
	dedicated := *j
	dedicated.helper = buildHelper(t)
	home, _ := os.UserHomeDir()
	marker := filepath.Join(home, ".isopod-jail-test-marker")
	if err := os.WriteFile(marker, []byte("secret"), 0o600); err == nil {
		t.Cleanup(func() { os.Remove(marker) })
	}
	spec := sleeper(t)
	p, err := startJailed(t, &dedicated, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink("/proc/" + strconv.Itoa(p.Pid) + "/exe"); got != "/bin/sleep" && got != "/usr/bin/sleep" {
		t.Errorf("the jailed process runs %q; want sleep", got)
	}
	checkConfined(t, &dedicated, p.Pid, marker)
	checkCgroup(t, &dedicated, p.Pid)

	stale := *j
	stale.helper = buildHelper(t, "-ldflags=-X isopod/internal/jail/jailchild.Version=0")
	spec.Name += "-stale"
	if _, err := startJailed(t, &stale, spec); err == nil || !strings.Contains(err.Error(), "the jail helper "+stale.helper+" is from another isopod build") ||
		!strings.Contains(err.Error(), "reinstall isopod") {
		t.Errorf("a helper of another build: %v; want a refusal that names it and says to reinstall", err)
	}
}
