package packaging

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestSums: SHA256SUMS lists exactly the three artifacts, with their
// digests, in the format sha256sum -c reads.
func TestSums(t *testing.T) {
	r := artifacts(t)
	b, err := os.ReadFile(filepath.Join(r.dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range lines(string(b)) {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not `<sha256>  <name>`", l)
		}
		names = append(names, name)
		f, err := os.Open(filepath.Join(r.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			t.Errorf("%s: sha256 %s; SHA256SUMS says %s", name, got, sum)
		}
	}
	want := []string{filepath.Base(r.tar), filepath.Base(r.rpm), filepath.Base(r.deb)}
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("SHA256SUMS lists %v; want %v", names, want)
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
		cmd.Dir = r.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum --check: %v\n%s", err, out)
		}
	}
}

// TestVersion: the artifacts carry the one version, which is
// internal/version/VERSION with at most a build suffix.
func TestVersion(t *testing.T) {
	r := artifacts(t)
	rel := releaseVersion(t)
	if r.version != rel && !strings.HasPrefix(r.version, rel+"+") {
		t.Errorf("the release is %s; internal/version/VERSION is %s", r.version, rel)
	}
}

// TestDeb checks the .deb's control fields and its files.
func TestDeb(t *testing.T) {
	r := artifacts(t)
	need(t, "dpkg-deb")
	field := func(name string) string { return strings.TrimSpace(output(t, "dpkg-deb", "--field", r.deb, name)) }
	if got := field("Version"); got != r.version {
		t.Errorf("Version %q; want %q", got, r.version)
	}
	if got := field("Architecture"); got != "amd64" {
		t.Errorf("Architecture %q; want amd64", got)
	}
	depends := field("Depends")
	for _, d := range []string{"qemu-system-x86 (>= 1:7.2)", "e2fsprogs", "squashfs-tools", "uidmap", "util-linux (>= 2.38)", "git"} {
		if !slices.Contains(strings.Split(depends, ", "), d) {
			t.Errorf("Depends %q lacks %q", depends, d)
		}
	}
	if got := field("Recommends"); got != "debootstrap" {
		t.Errorf("Recommends %q; want debootstrap", got)
	}
	var files []string
	for _, l := range lines(output(t, "dpkg-deb", "--contents", r.deb)) {
		f := strings.Fields(l)
		if len(f) < 6 || !strings.HasPrefix(f[0], "-") {
			continue
		}
		if f[1] != "root/root" {
			t.Errorf("%s is owned by %s; want root/root", f[5], f[1])
		}
		files = append(files, strings.TrimPrefix(f[5], "."))
	}
	want := append(slices.Clone(installed), "/usr/share/doc/isopod/copyright", "/usr/share/doc/isopod/changelog.gz", "/usr/share/lintian/overrides/isopod")
	sort.Strings(want)
	if !slices.Equal(files, want) {
		t.Errorf("the .deb's files:\n%s\nwant:\n%s", strings.Join(files, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range []string{"postinst", "postrm"} {
		if _, err := command(t, time.Minute, nil, "sh", "-c", `dpkg-deb --ctrl-tarfile "$1" | tar -tf - ./`+s, "sh", r.deb); err != nil {
			t.Errorf("the .deb has no %s: %v", s, err)
		}
	}
}

// TestLintian: lintian finds no error in the .deb.
func TestLintian(t *testing.T) {
	r := artifacts(t)
	need(t, "lintian")
	out, err := command(t, 5*time.Minute, nil, "lintian", "--info", "--display-level", ">=warning", r.deb)
	var errs []string
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "E: ") {
			errs = append(errs, l)
		} else if strings.HasPrefix(l, "W: ") {
			t.Logf("lintian: %s", l)
		}
	}
	if len(errs) > 0 {
		t.Errorf("lintian errors:\n%s", strings.Join(errs, "\n"))
	}
	// lintian exits non-zero on errors; without any, it failed itself.
	if err != nil && len(errs) == 0 {
		t.Errorf("lintian: %v", err)
	}
}

// TestRPM: rpm -qpl lists the expected files, and the metadata carries the
// version and the dependencies.
func TestRPM(t *testing.T) {
	r := artifacts(t)
	need(t, "rpm")
	files := lines(output(t, "rpm", "-qpl", r.rpm))
	want := append(slices.Clone(installed), ownedDirs...)
	want = append(want, "/usr/share/licenses/isopod", "/usr/share/licenses/isopod/LICENSE")
	sort.Strings(want)
	sort.Strings(files)
	if !slices.Equal(files, want) {
		t.Errorf("rpm -qpl:\n%s\nwant:\n%s", strings.Join(files, "\n"), strings.Join(want, "\n"))
	}
	if got := strings.TrimSpace(output(t, "rpm", "-qp", "--queryformat", "%{VERSION} %{ARCH}", r.rpm)); got != r.version+" x86_64" {
		t.Errorf("rpm version and arch %q; want %q", got, r.version+" x86_64")
	}
	requires := lines(output(t, "rpm", "-qp", "--requires", r.rpm))
	for _, d := range []string{"qemu-system-x86-core >= 7.2", "e2fsprogs", "squashfs-tools", "shadow-utils", "util-linux >= 2.38", "git"} {
		if !slices.Contains(requires, d) {
			t.Errorf("rpm requires %v; lacks %q", requires, d)
		}
	}
	if rec := lines(output(t, "rpm", "-qp", "--recommends", r.rpm)); !slices.Equal(rec, []string{"debootstrap"}) {
		t.Errorf("rpm recommends %v; want debootstrap", rec)
	}
	scripts := output(t, "rpm", "-qp", "--scripts", r.rpm)
	for _, s := range []string{"useradd --system", "userdel"} {
		if !strings.Contains(scripts, s) {
			t.Errorf("the rpm's scripts do not run %q:\n%s", s, scripts)
		}
	}
}

// TestReproducible: a second build of the same commit is byte-identical.
func TestReproducible(t *testing.T) {
	r := artifacts(t)
	again := os.Getenv("ISOPOD_DIST_AGAIN")
	if again == "" {
		t.Skip("ISOPOD_DIST_AGAIN is not set: build the same commit again into another directory to compare (scripts/test-packages.sh does)")
	}
	for _, name := range []string{filepath.Base(r.deb), filepath.Base(r.rpm), filepath.Base(r.tar), "SHA256SUMS"} {
		a, err := os.ReadFile(filepath.Join(r.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(again, name))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Errorf("%s differs between the two builds (%d and %d bytes)", name, len(a), len(b))
		}
	}
}

// TestTarball unpacks the tarball in a temporary directory and runs it
// from there: --version, doctor (which finds the agent in the tarball's
// lib/isopod) and the plugin's launcher (which finds the tarball's server).
func TestTarball(t *testing.T) {
	r := artifacts(t)
	dir := t.TempDir()
	top := unpack(t, r.tar, dir)
	if want := "isopod-" + r.version + "-linux-amd64"; top != want {
		t.Fatalf("the tarball's top directory is %q; want %q", top, want)
	}
	root := filepath.Join(dir, top)
	for _, f := range installed {
		if _, err := os.Stat(filepath.Join(root, strings.TrimPrefix(f, "/usr/"))); err != nil {
			t.Errorf("the tarball lacks %s: %v", f, err)
		}
	}
	isopod := filepath.Join(root, "bin", "isopod")
	if got := strings.TrimSpace(output(t, isopod, "--version")); got != "isopod version "+r.version {
		t.Errorf("isopod --version: %q; want %q", got, "isopod version "+r.version)
	}

	home := filepath.Join(dir, "home")
	out, err := command(t, time.Minute, []string{"ISOPOD_HOME=" + home, "ISOPOD_AGENT_BIN="}, isopod, "doctor")
	var rep struct {
		OK     bool   `json:"ok"`
		Home   string `json:"home"`
		Checks []struct {
			Name   string         `json:"name"`
			OK     bool           `json:"ok"`
			Fix    string         `json:"fix"`
			Detail map[string]any `json:"detail"`
		} `json:"checks"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("isopod doctor printed no JSON report (%v): %q, %v", jerr, out, err)
	}
	// A fresh state root has no kernel: doctor fails, and says what to run.
	var ee *exec.ExitError
	if rep.OK || !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("doctor on an empty state root: ok %v, %v; want ok false, exit 1", rep.OK, err)
	}
	if rep.Home != home {
		t.Errorf("doctor checked %q; want ISOPOD_HOME %q", rep.Home, home)
	}
	type check = struct {
		Name   string         `json:"name"`
		OK     bool           `json:"ok"`
		Fix    string         `json:"fix"`
		Detail map[string]any `json:"detail"`
	}
	checks := map[string]check{}
	for _, c := range rep.Checks {
		checks[c.Name] = c
	}
	if c := checks["agent"]; !c.OK || c.Detail["path"] != filepath.Join(root, "lib", "isopod", "isopod-agent") {
		t.Errorf("doctor's agent check %+v; want the tarball's lib/isopod/isopod-agent", c)
	}
	if c := checks["kernel"]; c.Name == "" || c.OK || c.Fix != "isopod image fetch-kernel" {
		t.Errorf("doctor's kernel check %+v; want failed, fix isopod image fetch-kernel", c)
	}
	if _, err := os.Stat(home); err == nil {
		t.Errorf("doctor created the state root %s", home)
	}

	// The plugin in share/isopod finds the server in the tarball's bin/
	// with nothing on PATH.
	launcher := filepath.Join(root, "share", "isopod", ".claude-plugin", "isopod-mcp")
	out, err = command(t, time.Minute, []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "CLAUDE_PLUGIN_ROOT=", "ISOPOD_MCP_BIN="}, launcher, "--version")
	if err != nil || strings.TrimSpace(out) != "isopod-mcp version "+r.version {
		t.Errorf("the tarball's launcher: %q, %v; want isopod-mcp version %s", out, err, r.version)
	}
}

// unpack extracts a .tar.gz into dir (regular files and directories only,
// checking every entry) and returns its one top-level directory.
func unpack(t *testing.T, archive, dir string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	tops := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			t.Fatalf("tarball entry %q escapes its directory", h.Name)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d; want 0:0", h.Name, h.Uid, h.Gid)
		}
		top, _, _ := strings.Cut(name, string(filepath.Separator))
		tops[top] = true
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, os.FileMode(h.Mode)&0o777)
			if err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("tarball entry %s has type %q; want only files and directories", h.Name, h.Typeflag)
		}
	}
	if len(tops) != 1 {
		t.Fatalf("the tarball has %d top-level entries (%v); want one directory", len(tops), tops)
	}
	for top := range tops {
		return top
	}
	return ""
}
