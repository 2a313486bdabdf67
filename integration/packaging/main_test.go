// Package packaging tests the release artifacts that scripts/release.sh
// writes: their checksums, metadata and contents, lintian's verdict, the
// tarball run from where it is unpacked, byte-for-byte reproducibility, and
// the .deb installed into a fresh Debian tree, used, and purged.
//
// The tests need artifacts to test, so they run only when told where they
// are, and skip otherwise (scripts/test-packages.sh sets all of these):
//
//	ISOPOD_DIST          the artifacts (required by every test)
//	ISOPOD_DIST_AGAIN    a second build of the same commit: must be identical
//	ISOPOD_PACKAGE_TREE  a fresh debootstrap minbase tree of Debian 12 to
//	                     install the .deb into (it is changed for good); needs
//	                     root and bubblewrap
package packaging

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// release is what the tests know of the artifacts under test.
type release struct {
	dir     string
	version string // as the binaries report it
	deb     string // paths
	rpm     string
	tar     string
}

var debNameRE = regexp.MustCompile(`^isopod_(.+)_amd64\.deb$`)

// artifacts finds the release in $ISOPOD_DIST, or skips.
func artifacts(t *testing.T) release {
	t.Helper()
	dir := os.Getenv("ISOPOD_DIST")
	if dir == "" {
		t.Skip("ISOPOD_DIST is not set: build the release with scripts/release.sh and point ISOPOD_DIST at it (scripts/test-packages.sh does both)")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var r release
	for _, e := range ents {
		if m := debNameRE.FindStringSubmatch(e.Name()); m != nil {
			if r.version != "" {
				t.Fatalf("%s holds more than one release", dir)
			}
			r.version = m[1]
		}
	}
	if r.version == "" {
		t.Fatalf("no isopod_<version>_amd64.deb in %s", dir)
	}
	r.dir = dir
	r.deb = filepath.Join(dir, "isopod_"+r.version+"_amd64.deb")
	r.rpm = filepath.Join(dir, "isopod-"+r.version+".x86_64.rpm")
	r.tar = filepath.Join(dir, "isopod-"+r.version+"-linux-amd64.tar.gz")
	for _, p := range []string{r.rpm, r.tar, filepath.Join(dir, "SHA256SUMS")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// need skips unless every tool is on PATH.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (on Debian: apt-get install %s)", tool, debianPackage(tool))
		}
	}
}

func debianPackage(tool string) string {
	switch tool {
	case "bwrap":
		return "bubblewrap"
	case "dpkg-deb":
		return "dpkg"
	}
	return tool
}

// output runs a command and returns its stdout; a failure fails the test
// with stderr.
func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := command(t, 5*time.Minute, nil, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

// command runs name with args (and env added, when not nil) and returns
// stdout, or an error that carries the exit status and stderr.
func command(t *testing.T, timeout time.Duration, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), &runError{err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

type runError struct {
	err    error
	stderr string
}

func (e *runError) Error() string { return fmt.Sprintf("%v: %s", e.err, tail(e.stderr, 4000)) }
func (e *runError) Unwrap() error { return e.err }

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// lines splits s into non-empty trimmed lines.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// releaseVersion is internal/version/VERSION of this checkout.
func releaseVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "internal", "version", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// installed are the files every package installs, under /usr.
var installed = []string{
	"/usr/bin/isopod",
	"/usr/bin/isopod-mcp",
	"/usr/lib/isopod/isopod-agent",
	"/usr/lib/isopod/isopod-jail",
	"/usr/share/isopod/.claude-plugin/plugin.json",
	"/usr/share/isopod/.claude-plugin/marketplace.json",
	"/usr/share/isopod/.claude-plugin/isopod-mcp",
	"/usr/share/isopod/skill/SKILL.md",
	"/usr/share/doc/isopod/README.md",
	"/usr/share/doc/isopod/SECURITY.md",
	"/usr/share/doc/isopod/BENCHMARKS.md",
	"/usr/share/doc/isopod/docs/architecture.md",
	"/usr/share/doc/isopod/docs/mcp-usage.md",
	"/usr/share/doc/isopod/docs/egress-ledger.md",
	"/usr/share/doc/isopod/docs/credentials.md",
	"/usr/share/doc/isopod/third-party-notices.gz",
}

// ownedDirs are the directories that are isopod's alone.
var ownedDirs = []string{
	"/usr/lib/isopod",
	"/usr/share/isopod",
	"/usr/share/isopod/.claude-plugin",
	"/usr/share/isopod/skill",
	"/usr/share/doc/isopod",
	"/usr/share/doc/isopod/docs",
}
