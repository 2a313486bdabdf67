package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// repo is the isopod checkout this module lives in: the source tree the
// tests package.
const repo = "../.."

func repoVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "internal", "version", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// fakeRelease is a Release of stand-in binaries, with the binary checks
// and the notices replaced.
func fakeRelease(t *testing.T, out string, epoch int64) *Release {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range binaries {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("stand-in for "+n+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return &Release{
		Src: repo, Bin: bin, Version: repoVersion(t) + "+g1a2b3c4d", Commit: strings.Repeat("1a2b3c4d", 5),
		Epoch: epoch, Out: out,
		notices:     func(context.Context, []string) ([]byte, error) { return []byte("notices\n"), nil },
		checkBinary: func(context.Context, string, string) error { return nil },
	}
}

func TestValidate(t *testing.T) {
	v := repoVersion(t)
	for _, tt := range []struct {
		version string
		ok      bool
	}{
		{v, true},
		{v + "+g1a2b3c4d", true},
		{v + "+g1a2b3c4d.dirty", true},
		{"9" + v, false},        // another release
		{v + "-rc1", false},     // not a build suffix
		{v + "+g1a2_b3", false}, // not in Debian's or RPM's alphabet
		{"v" + v, false},        // a tag, not a version
		{"0.1", false},          // MAJOR.MINOR only
	} {
		r := fakeRelease(t, t.TempDir(), 1700000000)
		r.Version = tt.version
		if err := r.validate(); (err == nil) != tt.ok {
			t.Errorf("version %q: %v; want ok %v", tt.version, err, tt.ok)
		}
	}
}

// TestReproducible: the same inputs give the same bytes; another commit
// time gives other bytes.
func TestReproducible(t *testing.T) {
	build := func(epoch int64) map[string][]byte {
		t.Helper()
		out := t.TempDir()
		arts, err := fakeRelease(t, out, epoch).Build(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]byte{}
		for _, a := range arts {
			b, err := os.ReadFile(a)
			if err != nil {
				t.Fatal(err)
			}
			got[filepath.Base(a)] = b
		}
		return got
	}
	a, b, c := build(1700000000), build(1700000000), build(1700000001)
	if len(a) != 4 {
		t.Fatalf("built %d files; want 3 artifacts and SHA256SUMS", len(a))
	}
	for name, ab := range a {
		if !bytes.Equal(ab, b[name]) {
			t.Errorf("%s differs between two builds of the same inputs", name)
		}
		if name != "SHA256SUMS" && bytes.Equal(ab, c[name]) {
			t.Errorf("%s is the same with another SOURCE_DATE_EPOCH: the time is not in it", name)
		}
	}
}

// TestTarball: one top directory laid out as a prefix, every entry owned
// by root and dated at the commit, modes from the table.
func TestTarball(t *testing.T) {
	const epoch = 1700000000
	r := fakeRelease(t, t.TempDir(), epoch)
	if _, err := r.Build(t.Context()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(r.Out, r.tarName()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header names %q at %v; want neither", zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	modes := map[string]int64{}
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		modes[h.Name] = h.Mode
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "root" || h.Gname != "root" || !h.ModTime.Equal(time.Unix(epoch, 0)) {
			t.Errorf("%s: %d:%d %s:%s at %v; want root at the commit time", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("entries are not sorted: %v", names)
	}
	top := r.tarTop() + "/"
	for _, n := range names {
		if !strings.HasPrefix(n, top) {
			t.Errorf("%s is outside %s", n, top)
		}
	}
	for name, mode := range map[string]int64{
		"bin/isopod": 0o755, "bin/isopod-mcp": 0o755, "lib/isopod/isopod-agent": 0o755, "lib/isopod/isopod-jail": 0o755,
		"share/isopod/.claude-plugin/isopod-mcp": 0o755, "share/isopod/.claude-plugin/plugin.json": 0o644,
		"share/isopod/skill/SKILL.md": 0o644, "share/doc/isopod/LICENSE": 0o644, "share/doc/isopod/README.md": 0o644,
		"share/isopod/": 0o755,
	} {
		if got, ok := modes[top+name]; !ok || got != mode {
			t.Errorf("%s: mode %o (present %v); want %o", name, got, ok, mode)
		}
	}
	for _, n := range names {
		if strings.Contains(n, "copyright") || strings.Contains(n, "lintian") || strings.Contains(n, "licenses/") {
			t.Errorf("the tarball holds the packages' own %s", n)
		}
	}
}

func TestDebCopyright(t *testing.T) {
	lic, err := os.ReadFile(filepath.Join(repo, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	c := string(debCopyright(lic))
	for _, want := range []string{
		"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
		"\nFiles: *\nCopyright: the isopod authors\nLicense: Expat\n Permission is hereby granted",
		"\n .\n THE SOFTWARE IS PROVIDED",
		"third-party-notices.gz",
	} {
		if !strings.Contains(c, want) {
			t.Errorf("copyright lacks %q:\n%s", want, c)
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(c, "\n"), "\n") {
		if l == "" || strings.HasPrefix(l, " ") || strings.Contains(l, ": ") {
			continue
		}
		t.Errorf("copyright line %q is neither a field nor a continuation", l)
	}
}

func TestChangelog(t *testing.T) {
	r := fakeRelease(t, t.TempDir(), 1700000000)
	got := string(r.changelog())
	want := "isopod (" + r.Version + ") unstable; urgency=medium\n\n  * Built from commit " + r.Commit +
		".\n\n -- " + maintainer + "  Tue, 14 Nov 2023 22:13:20 +0000\n"
	if got != want {
		t.Errorf("changelog:\n%s\nwant:\n%s", got, want)
	}
}

// TestEveryFileIsInTheTree: the table names only files the repository has.
func TestEveryFileIsInTheTree(t *testing.T) {
	for _, f := range releaseFiles() {
		if f.from != fromSrc {
			continue
		}
		if _, err := os.Stat(filepath.Join(repo, f.src)); err != nil {
			t.Errorf("%s: %v", f.dst, err)
		}
	}
}

// TestMissingBinary: a release without one of its binaries fails before
// writing anything.
func TestMissingBinary(t *testing.T) {
	out := filepath.Join(t.TempDir(), "dist")
	r := fakeRelease(t, out, 1700000000)
	if err := os.Remove(filepath.Join(r.Bin, "isopod-agent")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Build(t.Context()); err == nil || !strings.Contains(err.Error(), "isopod-agent") {
		t.Fatalf("Build without the agent: %v; want an error naming it", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) > 0 {
		t.Errorf("a failed build left %d files in %s", len(ents), out)
	}
}
