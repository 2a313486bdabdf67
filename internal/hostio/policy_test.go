package hostio

import (
	"bytes"
	"errors"
	"isopod/internal/hostio/hostiotest"
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

// hostTree is the confinement fixture of hostiotest, with the policy
// that confines to its root.
type hostTree struct{ hostiotest.Tree }

func newHostTree(t *testing.T) hostTree {
	t.Helper()
	return hostTree{hostiotest.NewTree(t, MaxStdinFileBytes)}
}

func (h hostTree) policy() Policy {
	return Policy{Root: h.Root, Home: h.Home, StdinFile: true, CopyOut: true}
}

func TestResolveCopyOut(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	if err := syscall.Mknod(filepath.Join(h.Root, "sock"), syscall.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		arg  string
		want string // resolved path; "" means refused
		msg  []string
	}{
		{"plain relative", "out.txt", filepath.Join(h.Root, "out.txt"), nil},
		{"absolute inside", filepath.Join(h.Root, "sub", "x"), filepath.Join(h.Root, "sub", "x"), nil},
		{"dot and trailing separators", "sub/./x.txt//", filepath.Join(h.Root, "sub", "x.txt"), nil},
		{"dotdot over existing dir", "sub/../ok.txt", filepath.Join(h.Root, "ok.txt"), nil},
		{"missing parents", "new/dir/x.txt", filepath.Join(h.Root, "new", "dir", "x.txt"), nil},
		{"symlink inside to inside", "in-link", filepath.Join(h.Root, "ok.txt"), nil},
		{"dotdot escape", "../outside/x", "", []string{h.Root, knobs.MCPHostIORoot}},
		{"deep dotdot escape", "sub/../../outside/secret.txt", "", []string{h.Root, knobs.MCPHostIORoot}},
		{"absolute outside", filepath.Join(h.Outside, "new.txt"), "", []string{h.Root, knobs.MCPHostIORoot}},
		{"absolute etc", "/etc/passwd", "", []string{"outside the host-I/O root"}},
		{"symlink pointing out", "out-link", "", []string{h.Secret, h.Root}},
		{"symlinked dir pointing out", "outdir-link/new.txt", "", []string{h.Root}},
		{"relative symlink inside", "rel-link", filepath.Join(h.Root, "ok.txt"), nil},
		{"relative symlink pointing out", "rel-out", "", []string{h.Root, knobs.MCPHostIORoot}},
		{"dangling symlink pointing out", "dangling", "", []string{h.Outside, "outside the host-I/O root"}},
		{"dangling symlink", "in-dangling", "", []string{"does not resolve"}},
		{"dangling symlink with trailing separator", "in-dangling/", "", []string{"does not resolve"}},
		{"dangling symlink as a parent", "in-dangling/x", "", []string{"does not resolve"}},
		{"symlink loop", "loop", "", []string{"does not resolve"}},
		{"dotdot below a missing dir", "newdir/../x", "", []string{`".." below a directory that does not exist`}},
		{"into the state dir", ".isopod/credentials.json", "", []string{"state directory", h.Home}},
		{"into the state dir via a link", "home-link/x", "", []string{"state directory"}},
		// A FIFO is written straight through, as a device is.
		{"a FIFO", "fifo", filepath.Join(h.Root, "fifo"), nil},
		{"a socket", "sock", "", []string{"a socket", "a character device or a FIFO"}},
		{"a directory", "sub", "", []string{"a directory"}},
		{"a file as a parent", "ok.txt/x", "", []string{"not a directory"}},
		{"tilde", "~/x", "", []string{`"~" is not expanded`}},
		{"empty", "", "", []string{"empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := hostiotest.Snapshot(t, h.Base)
			got, err := p.ResolveCopyOut(tc.arg)
			hostiotest.SameSnapshot(t, before, hostiotest.Snapshot(t, h.Base))
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
		{"dotdot escape", "../outside/secret.txt", "", errdefs.ErrInvalidArgument, []string{h.Root, knobs.MCPHostIORoot}},
		{"absolute outside", h.Secret, "", errdefs.ErrInvalidArgument, []string{h.Root, knobs.MCPHostIORoot}},
		{"symlink pointing out", "out-link", "", errdefs.ErrInvalidArgument, []string{h.Root}},
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
		{"relative symlink pointing out", "rel-out", "", errdefs.ErrInvalidArgument, []string{h.Root}},
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
	dev := filepath.Join(h.Root, "null")
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
	blk := filepath.Join(h.Root, "blk")
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
	viaLink := filepath.Join(h.Base, "root-link")
	if err := os.Symlink(h.Root, viaLink); err != nil {
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
		{"defaults", on, h.Root, true, true, ""},
		{"cwd through a symlink is canonical", root(viaLink), h.Root, true, true, ""},
		{"moved root", root(h.Outside), h.Outside, true, true, ""},
		{"copy_out off", with(func(s *settings.HostIO) { s.CopyOut = false }), h.Root, true, false, ""},
		{"stdin_file off", with(func(s *settings.HostIO) { s.StdinFile = false }), h.Root, false, true, ""},
		{"the settings' warnings are kept", with(func(s *settings.HostIO) { s.CopyOut, s.Warnings = false, []string{"treating it as off"} }), h.Root, true, false, "treating it as off"},
		{"blank root falls back", root("  "), h.Root, true, true, "set but empty"},
		{"relative root fails closed", root("proj"), "", true, true, "not an absolute path"},
		{"missing root fails closed", root(filepath.Join(h.Base, "nope")), "", true, true, "unusable"},
		{"file root fails closed", root(h.Secret), "", true, true, "unusable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The working directory is given through a symlink too.
			p, warns := Local(tc.set, viaLink, h.Home)
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
				if _, err := p.ResolveCopyOut(filepath.Join(h.Root, "x")); err == nil || !strings.Contains(err.Error(), knobs.MCPHostIORoot) {
					t.Errorf("fail-closed policy allowed a write or did not name the variable: %v", err)
				}
				if _, _, err := p.ReadStdinFile(filepath.Join(h.Root, "ok.txt")); err == nil {
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
	if _, _, err := p.ReadStdinFile(h.Secret); err == nil {
		t.Error("a policy without a root allowed a read")
	}
	if _, err := p.ResolveCopyOut(filepath.Join(h.Outside, "x")); err == nil {
		t.Error("a policy without a root allowed a write")
	}
}

func TestHostIOUnconfinedStillGuardsState(t *testing.T) {
	h := newHostTree(t)
	p, _ := Local(settings.HostIO{Root: "/", RootSet: true, StdinFile: true, CopyOut: true}, h.Root, h.Home)
	if !strings.Contains(p.String(), "UNCONFINED") {
		t.Errorf("policy line %q does not say unconfined", p.String())
	}
	if _, _, err := p.ReadStdinFile(h.Secret); err != nil {
		t.Errorf("unconfined read outside: %v", err)
	}
	if _, _, err := p.ReadStdinFile(filepath.Join(h.Home, "credentials.json")); err == nil {
		t.Error("unconfined policy read the state directory")
	}
	if _, err := p.ResolveCopyOut(filepath.Join(h.Home, "credentials.json")); err == nil {
		t.Error("unconfined policy wrote into the state directory")
	}
}
