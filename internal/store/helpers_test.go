package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

const (
	testFlavor = "base-min"
	testSHA    = "1111111111111111111111111111111111111111111111111111111111111111"
	otherSHA   = "2222222222222222222222222222222222222222222222222222222222222222"
)

// newStore opens a store in a fresh temporary directory.
func newStore(t *testing.T) *Store {
	t.Helper()
	root := t.TempDir()
	s, err := Open(filepath.Join(root, "stages"), Options{LocksDir: filepath.Join(root, "locks"), Version: "test-1"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// layerSpec describes a test layer file: its size and the data written at
// given offsets; everything else is a hole.
type layerSpec struct {
	size   int64
	chunks map[int64][]byte
	dense  bool // write zeros explicitly instead of leaving holes
}

// writeLayer creates the file described by spec in dir.
func writeLayer(t *testing.T, dir, name string, spec layerSpec) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if spec.dense {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < spec.size; off += int64(len(zero)) {
			n := min(int64(len(zero)), spec.size-off)
			if _, err := f.WriteAt(zero[:n], off); err != nil {
				t.Fatal(err)
			}
		}
	}
	for off, b := range spec.chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(spec.size); err != nil {
		t.Fatal(err)
	}
	return p
}

// randBytes returns n pseudo-random bytes from seed.
func randBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	_, _ = r.Read(b)
	return b
}

// smallLayer writes a 4 MiB sparse layer whose data derives from seed.
func smallLayer(t *testing.T, seed uint64) string {
	t.Helper()
	return writeLayer(t, t.TempDir(), "scratch.ext4", layerSpec{
		size:   4 << 20,
		chunks: map[int64][]byte{8192: randBytes(seed, 10000), 2 << 20: randBytes(seed+1000, 4096)},
	})
}

func req(scratch, label, parent string) CommitRequest {
	return CommitRequest{
		Scratch: scratch, Label: label, Parent: parent,
		BaseFlavor: testFlavor, BaseSHA256: testSHA,
		Argv: []string{"sh", "-c", "make deps"},
	}
}

// mustCommit commits and fails the test on error.
func mustCommit(t *testing.T, s *Store, r CommitRequest) Meta {
	t.Helper()
	m, _, err := s.Commit(context.Background(), r)
	if err != nil {
		t.Fatalf("Commit(%q): %v", r.Label, err)
	}
	return m
}

// wantErr checks that err is of class want and mentions every string in
// subs.
func wantErr(t *testing.T, err, want error, subs ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error = %v, want class %v", err, want)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

// noTemps fails if any temporary directory remains in the store.
func noTemps(t *testing.T, s *Store) {
	t.Helper()
	ents, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if isTemp(e.Name()) {
			t.Errorf("temporary directory %s remains", e.Name())
		}
	}
}

// needRoot skips tests that need root (device nodes, trusted xattrs) and
// e2fsprogs.
func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and e2fsprogs; skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make whiteout devices and trusted.overlay xattrs")
	}
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				t.Skipf("needs %s (e2fsprogs)", tool)
			}
		}
	}
}

// treeFile is one thing in a test layer's upper tree.
type treeFile struct {
	path string // relative to upper/
	data string // file content or symlink target
	kind string // "file" (default), "dir", "symlink", "whiteout", "opaque" (a dir)
	mode os.FileMode
}

// mkExt4 builds an ext4 scratch image holding upper/ (with files) and
// work/, like a finished run's scratch disk.
func mkExt4(t *testing.T, files []treeFile) string {
	t.Helper()
	dir := t.TempDir()
	upper := filepath.Join(dir, "tree", "upper")
	for _, d := range []string{upper, filepath.Join(dir, "tree", "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		p := filepath.Join(upper, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch f.kind {
		case "", "file":
			mode := f.mode
			if mode == 0 {
				mode = 0o644
			}
			if err = os.WriteFile(p, []byte(f.data), mode); err == nil {
				err = os.Chmod(p, mode)
			}
		case "dir":
			err = os.MkdirAll(p, 0o755)
		case "opaque":
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0)
			}
		case "symlink":
			err = os.Symlink(f.data, p)
		case "whiteout":
			err = unix.Mknod(p, unix.S_IFCHR|0o644, 0)
		default:
			t.Fatalf("unknown kind %q", f.kind)
		}
		if err != nil {
			t.Fatalf("making %s: %v", f.path, err)
		}
	}
	img := filepath.Join(dir, "scratch.ext4")
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", filepath.Join(dir, "tree"), img, "16M").CombinedOutput()
	if err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

// helperEnv is the environment key that turns the test binary into a
// commit helper process.
const helperEnv = "ISOPOD_STORE_TEST_HELPER"

// TestHelperProcess is not a test: a re-executed test binary runs it to
// commit from a separate process. See startHelper.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper for multi-process tests; runs only when re-executed")
	}
	s, err := Open(os.Getenv("HELPER_STAGES"), Options{LocksDir: os.Getenv("HELPER_LOCKS")})
	if err != nil {
		fmt.Printf("RESULT err open %v\n", err)
		os.Exit(0)
	}
	if os.Getenv("HELPER_STALL") == "1" {
		afterCopyHook = func() {
			fmt.Println("STALLED")
			time.Sleep(time.Hour)
		}
	}
	if g := os.Getenv("HELPER_GO"); g != "" {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			if _, err := os.Stat(g); err == nil {
				break
			}
		}
	}
	m, _, err := s.Commit(context.Background(), req(os.Getenv("HELPER_SCRATCH"), os.Getenv("HELPER_LABEL"), ""))
	if err != nil {
		fmt.Printf("RESULT err %s %v\n", errdefs.Class(err), err)
	} else {
		fmt.Printf("RESULT ok %s\n", m.ID)
	}
	os.Exit(0)
}

// startHelper starts a helper process committing scratch as label. The
// returned function reads what the helper printed so far.
func startHelper(t *testing.T, s *Store, locks, scratch, label, goFile string, stall bool) (*exec.Cmd, func() string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_STAGES="+s.Dir(), "HELPER_LOCKS="+locks,
		"HELPER_SCRATCH="+scratch, "HELPER_LABEL="+label, "HELPER_GO="+goFile)
	if stall {
		cmd.Env = append(cmd.Env, "HELPER_STALL=1")
	}
	outPath := filepath.Join(t.TempDir(), "helper.out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting helper: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, func() string {
		b, _ := os.ReadFile(outPath)
		return string(b)
	}
}

// hashLayer is HashLayer without the digest.
func hashLayer(ctx context.Context, path, parent, flavor string) (id string, size int64, err error) {
	id, _, size, err = HashLayer(ctx, path, parent, flavor)
	return id, size, err
}
