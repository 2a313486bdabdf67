package hostio

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/settings"
)

// hostTree is a confinement fixture: a root holding the state directory (as
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
	mustWrite(t, filepath.Join(h.root, "exact"), strings.Repeat("y", MaxStdinFileBytes))
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

func (h hostTree) policy() Policy {
	return Policy{Root: h.root, Home: h.home, StdinFile: true, CopyOut: true}
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

func TestResolveCopyOut(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	if err := syscall.Mknod(filepath.Join(h.root, "sock"), syscall.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		arg  string
		want string // resolved path; "" means refused
		msg  []string
	}{
		{"plain relative", "out.txt", filepath.Join(h.root, "out.txt"), nil},
		{"absolute inside", filepath.Join(h.root, "sub", "x"), filepath.Join(h.root, "sub", "x"), nil},
		{"dot and trailing separators", "sub/./x.txt//", filepath.Join(h.root, "sub", "x.txt"), nil},
		{"dotdot over existing dir", "sub/../ok.txt", filepath.Join(h.root, "ok.txt"), nil},
		{"missing parents", "new/dir/x.txt", filepath.Join(h.root, "new", "dir", "x.txt"), nil},
		{"symlink inside to inside", "in-link", filepath.Join(h.root, "ok.txt"), nil},
		{"dotdot escape", "../outside/x", "", []string{h.root, knobs.MCPHostIORoot}},
		{"deep dotdot escape", "sub/../../outside/secret.txt", "", []string{h.root, knobs.MCPHostIORoot}},
		{"absolute outside", filepath.Join(h.outside, "new.txt"), "", []string{h.root, knobs.MCPHostIORoot}},
		{"absolute etc", "/etc/passwd", "", []string{"outside the host-I/O root"}},
		{"symlink pointing out", "out-link", "", []string{h.secret, h.root}},
		{"symlinked dir pointing out", "outdir-link/new.txt", "", []string{h.root}},
		{"relative symlink inside", "rel-link", filepath.Join(h.root, "ok.txt"), nil},
		{"relative symlink pointing out", "rel-out", "", []string{h.root, knobs.MCPHostIORoot}},
		{"dangling symlink pointing out", "dangling", "", []string{h.outside, "outside the host-I/O root"}},
		{"dangling symlink", "in-dangling", "", []string{"does not resolve"}},
		{"dangling symlink with trailing separator", "in-dangling/", "", []string{"does not resolve"}},
		{"dangling symlink as a parent", "in-dangling/x", "", []string{"does not resolve"}},
		{"symlink loop", "loop", "", []string{"does not resolve"}},
		{"dotdot below a missing dir", "newdir/../x", "", []string{`".." below a directory that does not exist`}},
		{"into the state dir", ".isopod/credentials.json", "", []string{"state directory", h.home}},
		{"into the state dir via a link", "home-link/x", "", []string{"state directory"}},
		// A FIFO is written straight through, as a device is.
		{"a FIFO", "fifo", filepath.Join(h.root, "fifo"), nil},
		{"a socket", "sock", "", []string{"a socket", "a character device or a FIFO"}},
		{"a directory", "sub", "", []string{"a directory"}},
		{"a file as a parent", "ok.txt/x", "", []string{"not a directory"}},
		{"tilde", "~/x", "", []string{`"~" is not expanded`}},
		{"empty", "", "", []string{"empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshotDir(t, h.base)
			got, err := p.ResolveCopyOut(tc.arg)
			sameSnapshot(t, before, snapshotDir(t, h.base))
			if tc.want != "" {
				if err != nil {
					t.Fatalf("ResolveCopyOut(%q): %v", tc.arg, err)
				}
				if got != tc.want {
					t.Fatalf("ResolveCopyOut(%q) = %q, want %q", tc.arg, got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ResolveCopyOut(%q) = %q, want a refusal", tc.arg, got)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v is not invalid_argument", err)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

func TestReadStdinFile(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	tests := []struct {
		name  string
		arg   string
		want  string // content prefix; "" means refused
		class error
		msg   []string
	}{
		{"relative", "ok.txt", "hello from the host", nil, nil},
		{"through a symlink inside", "in-link", "hello from the host", nil, nil},
		{"exactly 4 MiB", "exact", "yyyy", nil, nil},
		{"dotdot escape", "../outside/secret.txt", "", errdefs.ErrInvalidArgument, []string{h.root, knobs.MCPHostIORoot}},
		{"absolute outside", h.secret, "", errdefs.ErrInvalidArgument, []string{h.root, knobs.MCPHostIORoot}},
		{"symlink pointing out", "out-link", "", errdefs.ErrInvalidArgument, []string{h.root}},
		{"state dir", ".isopod/credentials.json", "", errdefs.ErrInvalidArgument, []string{"state directory"}},
		{"state dir via link", "home-link/credentials.json", "", errdefs.ErrInvalidArgument, []string{"state directory"}},
		{"a FIFO", "fifo", "", errdefs.ErrInvalidArgument, []string{"a FIFO"}},
		{"a directory", "sub", "", errdefs.ErrInvalidArgument, []string{"a directory"}},
		{"5 MiB", "big", "", errdefs.ErrInvalidArgument, []string{"4 MiB"}},
		{"hard link", "hard", "", errdefs.ErrInvalidArgument, []string{"hard links"}},
		{"missing", "nope.txt", "", errdefs.ErrNotFound, []string{"does not exist"}},
		{"dangling inside", "in-dangling", "", errdefs.ErrNotFound, nil},
		{"dangling pointing out", "dangling", "", errdefs.ErrInvalidArgument, []string{"outside the host-I/O root"}},
		{"relative symlink inside", "rel-link", "hello from the host", nil, nil},
		{"relative symlink pointing out", "rel-out", "", errdefs.ErrInvalidArgument, []string{h.root}},
		{"symlink loop", "loop", "", errdefs.ErrNotFound, []string{"too many levels"}},
		{"dash", "-", "", errdefs.ErrInvalidArgument, []string{"stdin"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				data []byte
				err  error
			}
			ch := make(chan result, 1)
			go func() {
				d, _, err := p.ReadStdinFile(tc.arg)
				ch <- result{d, err}
			}()
			var r result
			select {
			case r = <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("ReadStdinFile(%q) blocked", tc.arg)
			}
			if tc.want != "" {
				if r.err != nil {
					t.Fatalf("ReadStdinFile(%q): %v", tc.arg, r.err)
				}
				if !bytes.HasPrefix(r.data, []byte(tc.want)) {
					t.Fatalf("ReadStdinFile(%q) = %.40q", tc.arg, r.data)
				}
				return
			}
			if r.err == nil {
				t.Fatalf("ReadStdinFile(%q) read %d bytes, want a refusal", tc.arg, len(r.data))
			}
			if !errors.Is(r.err, tc.class) {
				t.Errorf("error %v is not %v", r.err, tc.class)
			}
			for _, m := range tc.msg {
				if !strings.Contains(r.err.Error(), m) {
					t.Errorf("error %q does not mention %q", r.err, m)
				}
			}
		})
	}
}

func TestReadStdinFileDevice(t *testing.T) {
	h := newHostTree(t)
	dev := filepath.Join(h.root, "null")
	// Character device 1:3 (the null device); needs CAP_MKNOD.
	if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Skipf("cannot create a device node here (%v); needs root", err)
	}
	_, _, err := h.policy().ReadStdinFile("null")
	if err == nil || !strings.Contains(err.Error(), "character device") {
		t.Fatalf("ReadStdinFile(device) = %v, want a refusal naming a character device", err)
	}
	// copy_out writes a character device straight through, never a block
	// device.
	if _, err := h.policy().ResolveCopyOut("null"); err != nil {
		t.Errorf("ResolveCopyOut(character device): %v; want it accepted, to be written through", err)
	}
	blk := filepath.Join(h.root, "blk")
	if err := syscall.Mknod(blk, syscall.S_IFBLK|0o600, 7<<8|250); err != nil {
		t.Fatal(err)
	}
	if _, err := h.policy().ResolveCopyOut("blk"); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "a block device") {
		t.Errorf("ResolveCopyOut(block device) = %v; want a refusal naming a block device", err)
	}
}

func TestHostIODisabled(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	p.StdinFile, p.CopyOut = false, false
	if _, _, err := p.ReadStdinFile("ok.txt"); err == nil || !strings.Contains(err.Error(), knobs.MCPStdinFile+"=off") {
		t.Errorf("stdin_file with the switch off: %v", err)
	}
	if _, err := p.ResolveCopyOut("out.txt"); err == nil || !strings.Contains(err.Error(), knobs.MCPCopyOut+"=off") {
		t.Errorf("copy_out with the switch off: %v", err)
	}
}

func TestLocal(t *testing.T) {
	h := newHostTree(t)
	viaLink := filepath.Join(h.base, "root-link")
	if err := os.Symlink(h.root, viaLink); err != nil {
		t.Fatal(err)
	}
	on := settings.HostIO{StdinFile: true, CopyOut: true, Workspace: true}
	with := func(f func(*settings.HostIO)) settings.HostIO { s := on; f(&s); return s }
	root := func(r string) settings.HostIO { return with(func(s *settings.HostIO) { s.Root, s.RootSet = r, true }) }
	tests := []struct {
		name       string
		set        settings.HostIO
		wantRoot   string // "" means fail closed
		stdin, cpy bool
		warn       string
	}{
		{"defaults", on, h.root, true, true, ""},
		{"cwd through a symlink is canonical", root(viaLink), h.root, true, true, ""},
		{"moved root", root(h.outside), h.outside, true, true, ""},
		{"copy_out off", with(func(s *settings.HostIO) { s.CopyOut = false }), h.root, true, false, ""},
		{"stdin_file off", with(func(s *settings.HostIO) { s.StdinFile = false }), h.root, false, true, ""},
		{"the settings' warnings are kept", with(func(s *settings.HostIO) { s.CopyOut, s.Warnings = false, []string{"treating it as off"} }), h.root, true, false, "treating it as off"},
		{"blank root falls back", root("  "), h.root, true, true, "set but empty"},
		{"relative root fails closed", root("proj"), "", true, true, "not an absolute path"},
		{"missing root fails closed", root(filepath.Join(h.base, "nope")), "", true, true, "unusable"},
		{"file root fails closed", root(h.secret), "", true, true, "unusable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The working directory is given through a symlink too.
			p, warns := Local(tc.set, viaLink, h.home)
			if p.StdinFile != tc.stdin || p.CopyOut != tc.cpy {
				t.Errorf("switches = stdin_file %v copy_out %v, want %v %v", p.StdinFile, p.CopyOut, tc.stdin, tc.cpy)
			}
			if tc.warn != "" && !strings.Contains(strings.Join(warns, "\n"), tc.warn) {
				t.Errorf("warnings %q lack %q", warns, tc.warn)
			}
			if tc.warn == "" && len(warns) > 0 {
				t.Errorf("unexpected warnings %q", warns)
			}
			if tc.wantRoot == "" {
				if _, err := p.ResolveCopyOut(filepath.Join(h.root, "x")); err == nil || !strings.Contains(err.Error(), knobs.MCPHostIORoot) {
					t.Errorf("fail-closed policy allowed a write or did not name the variable: %v", err)
				}
				if _, _, err := p.ReadStdinFile(filepath.Join(h.root, "ok.txt")); err == nil {
					t.Error("fail-closed policy allowed a read")
				}
				if !strings.Contains(p.String(), "refused") {
					t.Errorf("policy line %q does not say host I/O is refused", p.String())
				}
				return
			}
			if p.Root != tc.wantRoot {
				t.Errorf("root = %q, want %q", p.Root, tc.wantRoot)
			}
			if !strings.Contains(p.String(), "confined to "+tc.wantRoot) {
				t.Errorf("policy line %q does not name the root", p.String())
			}
		})
	}
}

func TestZeroHostIOFailsClosed(t *testing.T) {
	h := newHostTree(t)
	var p Policy
	p.StdinFile, p.CopyOut = true, true
	if _, _, err := p.ReadStdinFile(h.secret); err == nil {
		t.Error("a policy without a root allowed a read")
	}
	if _, err := p.ResolveCopyOut(filepath.Join(h.outside, "x")); err == nil {
		t.Error("a policy without a root allowed a write")
	}
}

func TestHostIOUnconfinedStillGuardsState(t *testing.T) {
	h := newHostTree(t)
	p, _ := Local(settings.HostIO{Root: "/", RootSet: true, StdinFile: true, CopyOut: true}, h.root, h.home)
	if !strings.Contains(p.String(), "UNCONFINED") {
		t.Errorf("policy line %q does not say unconfined", p.String())
	}
	if _, _, err := p.ReadStdinFile(h.secret); err != nil {
		t.Errorf("unconfined read outside: %v", err)
	}
	if _, _, err := p.ReadStdinFile(filepath.Join(h.home, "credentials.json")); err == nil {
		t.Error("unconfined policy read the state directory")
	}
	if _, err := p.ResolveCopyOut(filepath.Join(h.home, "credentials.json")); err == nil {
		t.Error("unconfined policy wrote into the state directory")
	}
}
