package packaging

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// container runs commands in a Debian tree entered with bubblewrap: a
// mount namespace whose root is the tree (pivot_root, not chroot(2), which
// forbids the user namespaces of isopod's jail), with /proc, /sys, /dev
// (and /dev/kvm when the host has one), the host's network and resolver,
// and every capability of the root that runs it.
//
// /proc is the host's, and so are the pids: bubblewrap's own --proc covers
// parts of the new /proc read-only, and the kernel then refuses the jail
// the fresh /proc it mounts for each VMM.
type container struct {
	root string
}

func (c container) args(cmd []string) []string {
	a := []string{
		"--bind", c.root, "/",
		"--bind", "/proc", "/proc", "--dev", "/dev", "--bind", "/sys", "/sys",
		"--dev-bind-try", "/dev/kvm", "/dev/kvm",
		"--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
		"--unshare-ipc", "--unshare-uts", "--hostname", "isopod-pkgtest",
		"--die-with-parent", "--cap-add", "ALL",
		"--clearenv", "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8", "--setenv", "DEBIAN_FRONTEND", "noninteractive",
		"--chdir", "/root", "--",
	}
	return append(a, cmd...)
}

// run runs cmd in the container and returns its stdout and exit status;
// stderr goes to the test log when the command fails.
func (c container) run(t *testing.T, timeout time.Duration, cmd ...string) (string, int) {
	t.Helper()
	start := time.Now()
	out, err := command(t, timeout, nil, "bwrap", c.args(cmd)...)
	code := 0
	var re *runError
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
		if errors.As(err, &re) {
			t.Logf("%s: exit %d; stderr: %s", strings.Join(cmd, " "), code, tail(re.stderr, 3000))
		}
	default:
		t.Fatalf("%s: %v", strings.Join(cmd, " "), err)
	}
	t.Logf("%s: exit %d in %s", strings.Join(cmd, " "), code, time.Since(start).Round(100*time.Millisecond))
	return out, code
}

// must runs cmd and fails the test unless it exits 0.
func (c container) must(t *testing.T, timeout time.Duration, cmd ...string) string {
	t.Helper()
	out, code := c.run(t, timeout, cmd...)
	if code != 0 {
		t.Fatalf("%s: exit %d; stdout: %s", strings.Join(cmd, " "), code, tail(out, 3000))
	}
	return out
}

// jsonReport parses the one JSON object an isopod command prints.
func jsonReport(t *testing.T, what, out string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%s printed no JSON object (%v): %q", what, err, tail(out, 2000))
	}
	return m
}

// doctorChecks indexes a doctor report's checks by name.
func doctorChecks(t *testing.T, rep map[string]any) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	list, _ := rep["checks"].([]any)
	for _, c := range list {
		m, _ := c.(map[string]any)
		name, _ := m["name"].(string)
		out[name] = m
	}
	if len(out) == 0 {
		t.Fatalf("doctor report has no checks: %v", rep)
	}
	return out
}

// TestInstall installs the .deb into the fresh Debian 12 tree in
// $ISOPOD_PACKAGE_TREE with apt, which resolves its dependencies from
// Debian's mirrors; runs isopod --version, image fetch-kernel, image build
// initramfs base-min, doctor and run -- true in it; purges the package;
// and checks that nothing of it is left outside $ISOPOD_HOME, the jail's
// system user included.
func TestInstall(t *testing.T) {
	r := artifacts(t)
	tree := os.Getenv("ISOPOD_PACKAGE_TREE")
	if tree == "" {
		t.Skip("ISOPOD_PACKAGE_TREE is not set: make a fresh tree with `debootstrap --variant=minbase bookworm DIR` and point ISOPOD_PACKAGE_TREE at it (scripts/test-packages.sh does)")
	}
	if os.Geteuid() != 0 {
		t.Skip("installing into the tree needs root (apt, dpkg and the jail's system user)")
	}
	need(t, "bwrap")
	if _, err := os.Stat(filepath.Join(tree, "usr", "bin", "apt-get")); err != nil {
		t.Fatalf("%s is not a Debian tree: %v", tree, err)
	}
	c := container{root: tree}
	const home = "/root/.isopod" // $ISOPOD_HOME in the container

	// Debian's bookworm, with its updates and security suites, from which
	// apt takes the dependencies and fetch-kernel the pinned kernel.
	mirror := envOr("ISOPOD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
	security := envOr("ISOPOD_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
	sources := "deb " + mirror + " bookworm main\n" +
		"deb " + mirror + " bookworm-updates main\n" +
		"deb " + security + " bookworm-security main\n"
	if err := os.WriteFile(filepath.Join(tree, "etc", "apt", "sources.list"), []byte(sources), 0o644); err != nil {
		t.Fatal(err)
	}

	before := treePaths(t, tree)

	// Install: apt resolves the dependencies (no recommends: debootstrap
	// is for base-debian, which this test does not build).
	deb := filepath.Base(r.deb)
	copyFile(t, r.deb, filepath.Join(tree, "tmp", deb))
	c.must(t, 10*time.Minute, "apt-get", "update", "-q")
	c.must(t, 20*time.Minute, "apt-get", "install", "-y", "-q", "--no-install-recommends", "/tmp/"+deb)
	if err := os.Remove(filepath.Join(tree, "tmp", deb)); err != nil {
		t.Fatal(err)
	}
	owned := lines(c.must(t, time.Minute, "dpkg", "-L", "isopod"))
	for _, f := range installed {
		if !slices.Contains(owned, f) {
			t.Errorf("dpkg -L isopod does not list %s", f)
		}
	}
	pw := strings.Split(strings.TrimSpace(c.must(t, time.Minute, "getent", "passwd", "isopod-vmm")), ":")
	if len(pw) != 7 || pw[2] == "0" || pw[5] != "/nonexistent" || !strings.HasSuffix(pw[6], "nologin") {
		t.Errorf("isopod-vmm is %v; want a system user with no home and no shell", pw)
	}

	t.Run("version", func(t *testing.T) {
		if got := strings.TrimSpace(c.must(t, time.Minute, "isopod", "--version")); got != "isopod version "+r.version {
			t.Errorf("isopod --version: %q; want %q", got, "isopod version "+r.version)
		}
		// The installed plugin's launcher finds the installed server.
		got := strings.TrimSpace(c.must(t, time.Minute, "env", "-i", "PATH=/usr/bin:/bin", "HOME=/root",
			"/usr/share/isopod/.claude-plugin/isopod-mcp", "--version"))
		if got != "isopod-mcp version "+r.version {
			t.Errorf("the installed launcher ran %q; want isopod-mcp version %s", got, r.version)
		}
	})

	// First use, before any image: the run is refused and says what to
	// run, and so does doctor.
	out, code := c.run(t, 2*time.Minute, "isopod", "run", "--", "true")
	if rep := jsonReport(t, "isopod run", out); code != 1 || rep["ok"] != false ||
		!strings.Contains(rep["error"].(string), "isopod image build base-min") {
		t.Errorf("a first run: exit %d, %v; want exit 1 and an error that says to run `isopod image build base-min`", code, rep)
	}
	out, code = c.run(t, 2*time.Minute, "isopod", "doctor")
	rep := jsonReport(t, "isopod doctor", out)
	checks := doctorChecks(t, rep)
	if code != 1 || rep["ok"] != false || checks["kernel"]["fix"] != "isopod image fetch-kernel" {
		t.Errorf("doctor before any image: exit %d, ok %v, kernel %v; want exit 1, not ok, fix isopod image fetch-kernel", code, rep["ok"], checks["kernel"])
	}
	for name, want := range map[string]any{"qemu": true, "jail": true, "agent": true, "disk": true} {
		if checks[name]["ok"] != want {
			t.Errorf("doctor's %s check: %v; want ok", name, checks[name])
		}
	}
	if p := checks["agent"]["detail"].(map[string]any)["path"]; p != "/usr/lib/isopod/isopod-agent" {
		t.Errorf("doctor found the agent at %v; want /usr/lib/isopod/isopod-agent", p)
	}

	// Images, from the installed files alone.
	if rep := jsonReport(t, "fetch-kernel", c.must(t, 15*time.Minute, "isopod", "image", "fetch-kernel")); rep["ok"] != true || rep["pinned"] != true {
		t.Fatalf("isopod image fetch-kernel: %v; want ok and pinned", rep)
	}
	if rep := jsonReport(t, "image build", c.must(t, 15*time.Minute, "isopod", "image", "build", "initramfs", "base-min")); rep["ok"] != true {
		t.Fatalf("isopod image build initramfs base-min: %v", rep)
	}
	out, code = c.run(t, 2*time.Minute, "isopod", "doctor")
	rep = jsonReport(t, "isopod doctor", out)
	if code != 0 || rep["ok"] != true {
		t.Errorf("doctor with the images built: exit %d, %s; want exit 0, ok", code, tail(out, 4000))
	}
	if why, _ := doctorChecks(t, rep)["jail"]["why"].(string); !strings.Contains(why, "QEMU starts in the jail") {
		t.Errorf("doctor's jail check says %q; want QEMU started in the jail", why)
	}
	t.Logf("doctor: accel %v", rep["accel"])

	out = c.must(t, 10*time.Minute, "isopod", "run", "--", "true")
	rep = jsonReport(t, "isopod run", out)
	if rep["ok"] != true || rep["exit_code"] != float64(0) {
		t.Fatalf("isopod run -- true: %s", tail(out, 4000))
	}
	t.Logf("isopod run -- true: accel %v, path %v, boot_ms %v, total_ms %v", rep["accel"], rep["path"], rep["boot_ms"], rep["total_ms"])
	if w, _ := rep["warnings"].([]any); len(w) > 0 {
		t.Logf("run warnings: %v", w)
	}

	// Purge: the package, its directories and its system user go; the
	// state under $ISOPOD_HOME stays.
	c.must(t, 5*time.Minute, "apt-get", "purge", "-y", "-q", "isopod")
	if out, code := c.run(t, time.Minute, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "isopod"); code == 0 && strings.TrimSpace(out) != "" {
		t.Errorf("dpkg still knows isopod after the purge: %q", out)
	}
	for _, db := range []string{"passwd", "group"} {
		if out, code := c.run(t, time.Minute, "getent", db, "isopod-vmm"); code != 2 {
			t.Errorf("getent %s isopod-vmm after the purge: exit %d, %q; want it gone (exit 2)", db, code, out)
		}
	}
	for _, f := range accountFiles {
		if b, err := os.ReadFile(filepath.Join(tree, "etc", f)); err == nil && strings.Contains(string(b), "isopod") {
			t.Errorf("/etc/%s still mentions isopod after the purge", f)
		}
	}
	for _, f := range append(slices.Clone(owned), ownedDirs...) {
		if !strings.Contains(f, "isopod") {
			continue // /usr, /usr/bin, ...: not isopod's alone
		}
		if _, err := os.Lstat(filepath.Join(tree, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is left after the purge", f)
		}
	}
	if _, err := os.Stat(filepath.Join(tree, home, "kernels")); err != nil {
		t.Errorf("the purge touched $ISOPOD_HOME: %v", err)
	}

	// Nothing new outside $ISOPOD_HOME but what other packages installed
	// and apt's own records.
	after := treePaths(t, tree)
	fromPackages := packageFiles(t, tree)
	var left []string
	for p := range after {
		if before[p] || fromPackages[p] || under(p, home) || under(p, "/var/lib/dpkg", "/var/lib/apt", "/var/cache", "/var/log") {
			continue
		}
		if runSockets(tree, p) {
			// The runs' socket directory: per user and state root, mode
			// 0700, emptied by every run, and in /tmp.
			continue
		}
		if shadowBackup(p) || p == "/run/adduser" {
			// shadow-utils' one-generation backups of the account
			// databases, which useradd and userdel write (they hold the
			// databases as they were before the last change), and the
			// lock of a dependency's adduser call.
			continue
		}
		left = append(left, p)
	}
	slices.Sort(left)
	if len(left) > 0 {
		t.Errorf("after the purge, these are new outside $ISOPOD_HOME and no package's:\n%s", strings.Join(left, "\n"))
	}
	for p := range after {
		if strings.Contains(p, "isopod") && !under(p, home) && !runSockets(tree, p) {
			t.Errorf("%s is left after the purge", p)
		}
	}
}

// runSockets reports whether p is root's directory of run sockets
// (/tmp/isopod-0) or a state root's under it, with no socket left in it.
func runSockets(tree, p string) bool {
	const dir = "/tmp/isopod-0"
	switch {
	case filepath.Dir(p) == dir:
		return emptyDir(filepath.Join(tree, p))
	case p != dir:
		return false
	}
	ents, err := os.ReadDir(filepath.Join(tree, p))
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !e.IsDir() || !emptyDir(filepath.Join(tree, p, e.Name())) {
			return false
		}
	}
	return true
}

// accountFiles are the account databases in /etc.
var accountFiles = []string{"passwd", "group", "shadow", "gshadow", "subuid", "subgid"}

// shadowBackup reports whether p is shadow-utils' backup of an account
// database (/etc/passwd- and so on).
func shadowBackup(p string) bool {
	for _, f := range accountFiles {
		if p == "/etc/"+f+"-" {
			return true
		}
	}
	return false
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// under reports whether p is one of dirs or inside one.
func under(p string, dirs ...string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func emptyDir(p string) bool {
	ents, err := os.ReadDir(p)
	return err == nil && len(ents) == 0
}

// treePaths lists every path in the tree (as seen inside it), but /proc,
// /sys and /dev.
func treePaths(t *testing.T, tree string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, tree), "/")
		if under(rel, "/proc", "/sys", "/dev") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		out[rel] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// packageFiles is every path the tree's installed packages list.
func packageFiles(t *testing.T, tree string) map[string]bool {
	t.Helper()
	lists, err := filepath.Glob(filepath.Join(tree, "var", "lib", "dpkg", "info", "*.list"))
	if err != nil || len(lists) == 0 {
		t.Fatalf("no dpkg file lists in %s: %v", tree, err)
	}
	out := map[string]bool{}
	for _, l := range lists {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range lines(string(b)) {
			out[p] = true
			// Debian 12 merges /bin into /usr/bin and so on; dpkg lists
			// either spelling.
			for _, pair := range [][2]string{{"/bin/", "/usr/bin/"}, {"/sbin/", "/usr/sbin/"}, {"/lib/", "/usr/lib/"}, {"/lib64/", "/usr/lib64/"}} {
				if rest, ok := strings.CutPrefix(p, pair[0]); ok {
					out[pair[1]+rest] = true
				} else if rest, ok := strings.CutPrefix(p, pair[1]); ok {
					out[pair[0]+rest] = true
				}
			}
		}
	}
	return out
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
