package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// tentry is one tar entry of a test layer.
type tentry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
}

func file(name, body string, mode int64) tentry {
	return tentry{name: name, body: body, typ: tar.TypeReg, mode: mode}
}
func dir(name string, mode int64) tentry { return tentry{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, target string) tentry {
	return tentry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) tentry {
	return tentry{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

func layerTar(t testing.TB, ents ...tentry) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0), Devmajor: e.major, Devminor: e.minor}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			w.Write([]byte(e.body))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// unpackLayers applies layers to a fresh staging root.
func unpackLayers(t *testing.T, lim unpackLimits, layers ...[]byte) (*unpacker, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	u, err := newUnpacker(root, lim)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		if err := u.apply(i, bytes.NewReader(l)); err != nil {
			return u, err
		}
	}
	return u, nil
}

func mustUnpack(t *testing.T, layers ...[]byte) *unpacker {
	t.Helper()
	u, err := unpackLayers(t, unpackLimits{}, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func exists(u *unpacker, p string) bool {
	_, err := os.Lstat(filepath.Join(u.dir, p))
	return err == nil
}

func TestUnpackModesAreMaskedOnTheHost(t *testing.T) {
	u := mustUnpack(t, layerTar(t,
		dir("usr/", 0o755), dir("usr/bin/", 0o755),
		tentry{name: "usr/bin/su", body: "x", typ: tar.TypeReg, mode: 0o4755, uid: 0, gid: 0},
		tentry{name: "home/me/.profile", body: "y", typ: tar.TypeReg, mode: 0o640, uid: 1000, gid: 1000},
		dir("tmp/", 0o1777),
	))
	fi, err := os.Stat(filepath.Join(u.dir, "usr/bin/su"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("host mode of usr/bin/su = %v; want 0600 and no setuid", fi.Mode())
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
		t.Errorf("host owner of usr/bin/su = %d; want the unpacking user %d", st.Uid, os.Geteuid())
	}
	su := u.lookup("/usr/bin/su")
	if su == nil || su.meta.mode != 0o4755 {
		t.Fatalf("tree mode of usr/bin/su = %+v; want 04755", su)
	}
	if p := u.lookup("/home/me/.profile"); p == nil || p.meta.uid != 1000 || p.meta.gid != 1000 || p.meta.mode != 0o640 {
		t.Errorf("tree entry of .profile = %+v; want 0640 1000:1000", p)
	}
	if d := u.lookup("/tmp"); d == nil || d.meta.mode != 0o1777 {
		t.Errorf("tree mode of /tmp = %+v; want 01777", d)
	}
	if home := u.lookup("/home"); home == nil || home.kind != kindDir || home.meta.mode != 0o755 {
		t.Errorf("implicit parent /home = %+v; want a 0755 directory", home)
	}
}

func TestUnpackWhiteoutsAndOpaqueDirectories(t *testing.T) {
	u := mustUnpack(t,
		layerTar(t, file("a/gone", "1", 0o644), file("a/kept", "2", 0o644),
			file("opq/lower", "3", 0o644), file("opq/sub/lower", "4", 0o644), file("other/x", "5", 0o644)),
		layerTar(t,
			file("a/.wh.gone", "", 0o644),
			file("new/f", "6", 0o644), file("new/.wh.f", "", 0o644), // a whiteout never hides its own layer
			file("opq/early", "7", 0o644), file("opq/sub/new", "8", 0o644),
			file("opq/.wh..wh..opq", "", 0o644),
			file("opq/late", "9", 0o644),
			file("other/.wh..wh.plnk", "", 0o644)),
	)
	for p, want := range map[string]bool{
		"a/gone": false, "a/kept": true, "new/f": true,
		"opq/lower": false, "opq/sub/lower": false, "opq/early": true, "opq/sub/new": true, "opq/late": true,
		"other/x": true, "opq/.wh..wh..opq": false, "a/.wh.gone": false, "other/.wh..wh.plnk": false,
	} {
		if got := exists(u, p) && u.lookup("/"+p) != nil; got != want {
			t.Errorf("%s present = %v; want %v", p, got, want)
		}
	}
	// A later layer's whiteout of a directory removes all below it.
	u = mustUnpack(t, layerTar(t, file("d/e/f", "1", 0o644)), layerTar(t, file(".wh.d", "", 0o644)))
	if exists(u, "d") || u.lookup("/d") != nil {
		t.Error("d survived its whiteout")
	}
}

func TestUnpackLinks(t *testing.T) {
	u := mustUnpack(t,
		layerTar(t, tentry{name: "bin/prog", body: "exe", typ: tar.TypeReg, mode: 0o4711, uid: 0, gid: 5},
			hardlink("bin/alias", "bin/prog"), symlink("lib", "usr/lib"), symlink("sh", "/bin/prog")),
		layerTar(t, file("lib/libc.so", "c", 0o644), hardlink("bin/third", "./bin/alias")),
	)
	var a, b syscall.Stat_t
	syscall.Lstat(filepath.Join(u.dir, "bin/prog"), &a)
	syscall.Lstat(filepath.Join(u.dir, "bin/third"), &b)
	if a.Ino == 0 || a.Ino != b.Ino || a.Nlink != 3 {
		t.Errorf("hard links: inodes %d and %d, %d links; want one inode with 3 links", a.Ino, b.Ino, a.Nlink)
	}
	if u.lookup("/bin/third").meta != u.lookup("/bin/prog").meta {
		t.Error("hard-linked names do not share their metadata")
	}
	if !exists(u, "usr/lib/libc.so") {
		t.Error("lib/libc.so did not land in usr/lib through the lib link")
	}
	if target, err := os.Readlink(filepath.Join(u.dir, "sh")); err != nil || target != "/bin/prog" {
		t.Errorf("sh -> %q (%v); want the link kept as /bin/prog", target, err)
	}
	if n := u.lookup("/sh"); n == nil || n.meta.mode != 0o4711 {
		t.Errorf("/sh resolves to %+v; want bin/prog", n)
	}
}

// TestUnpackNeverLeavesTheRoot: links that point outside the tree are
// followed inside it, and names that climb out are refused.
func TestUnpackNeverLeavesTheRoot(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host"), 0o644)
	rel, _ := filepath.Rel("/", outside)
	u := mustUnpack(t,
		layerTar(t, symlink("esc", "../../../../../../"+rel), symlink("abs", outside), symlink("etc", "/host/etc")),
		layerTar(t, file("esc/victim", "guest", 0o644), file("abs/new", "guest", 0o644), file("etc/passwd", "root", 0o644)),
	)
	if b, _ := os.ReadFile(victim); string(b) != "host" {
		t.Fatalf("a file outside the root was written through a link: %q", b)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Fatal("a file was created outside the root through an absolute link")
	}
	for _, p := range []string{rel + "/victim", rel + "/new", "host/etc/passwd"} {
		if !exists(u, p) {
			t.Errorf("%s: want it inside the root", p)
		}
	}
	for _, bad := range [][]byte{
		layerTar(t, file("../x", "1", 0o644)),
		layerTar(t, file("a/../../x", "1", 0o644)),
		layerTar(t, hardlink("h", "../../"+rel+"/victim")),
		layerTar(t, hardlink("h", "missing")),
		layerTar(t, file("ctl\nname", "1", 0o644)),
		layerTar(t, symlink("loop", "loop"), file("loop/x", "1", 0o644)),
	} {
		if _, err := unpackLayers(t, unpackLimits{}, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("want an invalid-argument refusal; got %v", err)
		}
	}
	u = mustUnpack(t, layerTar(t, file("/abs/path", "1", 0o644)))
	if !exists(u, "abs/path") {
		t.Error("an absolute entry name did not land under the root")
	}
}

func TestUnpackSkipsDevicesAndCapsSize(t *testing.T) {
	u := mustUnpack(t,
		layerTar(t, file("dev/null", "x", 0o644), file("wh", "lower", 0o644)),
		layerTar(t, tentry{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
			tentry{name: "wh", typ: tar.TypeChar, mode: 0}, // 0:0: the overlay whiteout form
			tentry{name: "fifo", typ: tar.TypeFifo, mode: 0o644}),
	)
	u.layer = 1
	if len(u.skipped) != 2 || !strings.Contains(strings.Join(u.skipped, " "), "/fifo (FIFO)") {
		t.Errorf("skipped = %q; want dev/null and fifo", u.skipped)
	}
	if exists(u, "dev/null") || exists(u, "wh") || exists(u, "fifo") {
		t.Error("a device, FIFO or whiteout left a file on the host")
	}
	_, err := unpackLayers(t, unpackLimits{MaxBytes: 10}, layerTar(t, file("a", "123456", 0o644), file("b", "123456", 0o644)))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "cap") {
		t.Errorf("over the size cap: %v; want a refusal naming the cap", err)
	}
}

func TestUnpackFindsTheShell(t *testing.T) {
	u := mustUnpack(t, layerTar(t, file("usr/bin/dash", "sh", 0o755), symlink("bin", "usr/bin"), symlink("usr/bin/sh", "dash")))
	if !u.hasShell() {
		t.Error("/bin/sh -> usr/bin/sh -> dash not found")
	}
	if u = mustUnpack(t, layerTar(t, file("app", "x", 0o755))); u.hasShell() {
		t.Error("a root without /bin/sh has a shell")
	}
}

func TestPseudoFileRestoresMetadata(t *testing.T) {
	u := mustUnpack(t, layerTar(t,
		tentry{name: `odd "name" \ here`, body: "x", typ: tar.TypeReg, mode: 0o4755, uid: 7, gid: 8},
		tentry{name: "d/", typ: tar.TypeDir, mode: 0o2750, uid: 1, gid: 2}, symlink("d/l", "/nowhere")))
	pf := filepath.Join(t.TempDir(), "pseudo")
	n, err := u.writePseudo(pf)
	if err != nil || n != 3 {
		t.Fatalf("writePseudo = %d, %v; want 3 entries", n, err)
	}
	b, _ := os.ReadFile(pf)
	want := "\"d/l\" m 777 0 0\n\"d\" m 2750 1 2\n\"odd \\\"name\\\" \\\\ here\" m 4755 7 8\n"
	if string(b) != want {
		t.Fatalf("pseudo file:\n%s\nwant:\n%s", b, want)
	}
	if _, err := exec.LookPath("mksquashfs"); err != nil {
		t.Skip("mksquashfs not installed")
	}
	if _, err := exec.LookPath("unsquashfs"); err != nil {
		t.Skip("unsquashfs not installed")
	}
	out := filepath.Join(t.TempDir(), "t.sqfs")
	if err := u.pack(t.Context(), pf, out); err != nil {
		t.Fatal(err)
	}
	ls := exec.Command("unsquashfs", "-lln", out)
	ls.Env = append(os.Environ(), "TZ=UTC")
	list, err := ls.CombinedOutput()
	if err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, list)
	}
	for _, w := range []string{"-rwsr-xr-x 7/8", "drwxr-s--- 1/2", "lrwxrwxrwx 0/0", "2023-11-14"} {
		if !strings.Contains(string(list), w) {
			t.Errorf("squashfs listing lacks %q:\n%s", w, list)
		}
	}
}
