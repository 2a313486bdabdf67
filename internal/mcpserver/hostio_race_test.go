package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"isopod/internal/hostio/hostiotest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/hostio"
)

// swapTree is a root whose directory d is exchanged, over and over, with a
// symlink to a directory outside the root (renameat2 RENAME_EXCHANGE), the
// way a process with write access to the root would race a check against
// an open.
type swapTree struct {
	root, outside string
	swaps         atomic.Int64
	stop          chan struct{}
	done          sync.WaitGroup
}

func newSwapTree(t *testing.T) *swapTree {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &swapTree{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside"), stop: make(chan struct{})}
	hostiotest.MustMkdir(t, filepath.Join(s.root, "d"))
	hostiotest.MustMkdir(t, s.outside)
	hostiotest.MustWrite(t, filepath.Join(s.root, "d", "in.txt"), "inside\n")
	hostiotest.MustWrite(t, filepath.Join(s.outside, "in.txt"), "SECRET\n")
	if err := os.Symlink(s.outside, filepath.Join(s.root, "swap")); err != nil {
		t.Fatal(err)
	}
	return s
}

// start runs the exchange loop until halt.
func (s *swapTree) start(t *testing.T) {
	d, swap := filepath.Join(s.root, "d"), filepath.Join(s.root, "swap")
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("renameat2: %v", err)
				return
			}
			s.swaps.Add(1)
		}
	}()
}

// halt stops the loop and leaves the real directory at d.
func (s *swapTree) halt(t *testing.T) {
	close(s.stop)
	s.done.Wait()
	if fi, err := os.Lstat(filepath.Join(s.root, "d")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(s.root, "d"), unix.AT_FDCWD, filepath.Join(s.root, "swap"), unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}
}

// outsideUntouched fails unless the outside directory holds only its
// secret, unchanged.
func (s *swapTree) outsideUntouched(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(s.outside)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "in.txt" {
			t.Errorf("something was written outside the root: %s", filepath.Join(s.outside, e.Name()))
		}
	}
	if b, _ := os.ReadFile(filepath.Join(s.outside, "in.txt")); string(b) != "SECRET\n" {
		t.Errorf("the file outside the root changed: %q", b)
	}
}

// TestStdinFileSurvivesParentSwaps reads d/in.txt while d is exchanged
// with a symlink to outside the root: every read is the file inside or a
// refusal, never the one outside. A naive reader (resolve, check, then
// open by name) in the same race shows the race is real.
func TestStdinFileSurvivesParentSwaps(t *testing.T) {
	s := newSwapTree(t)
	p := hostio.Policy{Root: s.root, StdinFile: true}
	s.start(t)
	defer s.halt(t)
	var ok, refused, naiveLeaks int
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 4000 && time.Now().Before(deadline); i++ {
		data, _, err := p.ReadStdinFile("d/in.txt")
		switch {
		case err != nil:
			refused++
		case string(data) != "inside\n":
			t.Fatalf("try %d read %q through a swapped parent", i, data)
		default:
			ok++
		}
		if naiveRead(s.root, "d/in.txt") == "SECRET\n" {
			naiveLeaks++
		}
	}
	t.Logf("%d swaps: %d reads inside, %d refused; a naive reader leaked %d times", s.swaps.Load(), ok, refused, naiveLeaks)
	if ok == 0 || s.swaps.Load() == 0 {
		t.Fatalf("the race proved nothing: %d reads succeeded over %d swaps", ok, s.swaps.Load())
	}
}

// naiveRead is the check-then-open a path-based guard does.
func naiveRead(root, rel string) string {
	resolved, err := filepath.EvalSymlinks(filepath.Join(root, rel))
	if err != nil || (resolved != root && !strings.HasPrefix(resolved, root+"/")) {
		return ""
	}
	b, _ := os.ReadFile(resolved)
	return string(b)
}

// TestCopyOutSurvivesParentSwaps runs sandbox_run calls with copy_out
// into d (and into missing directories below d) through the real core
// while d is exchanged with a symlink to outside the root: nothing is
// ever written outside, and every file that arrived is whole and inside.
func TestCopyOutSurvivesParentSwaps(t *testing.T) {
	s := newSwapTree(t)
	payload := make([]byte, 96<<10)
	rand.Read(payload)
	guest := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(guest, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	core, drv := newFakeCore(t)
	sess := connect(t, Config{Core: core, HostIO: hostio.Policy{Root: s.root, StdinFile: true, CopyOut: true}, NoStartupGC: true, GCEvery: -1})
	s.start(t)
	var ok, failed int
	// 40 calls, more while none has copied (a loaded host can lose the
	// race for each of the first ones), within the deadline.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; (i < 40 || ok == 0) && i < 400 && time.Now().Before(deadline); i++ {
		res := sess.call(t, context.Background(), ToolSandboxRun, map[string]any{
			"cmd": "cat", "base": "base-min", "network": false, "cwd": "/", "stdin_file": "d/in.txt",
			"copy_out": []map[string]any{
				{"guest": guest, "host": fmt.Sprintf("d/out-%d.bin", i)},
				{"guest": guest, "host": fmt.Sprintf("d/new-%d/deeper/x.bin", i)},
			},
		}, nil)
		text := resultText(res)
		if strings.Contains(text, "SECRET") {
			t.Fatalf("call %d returned the file outside the root: %.300s", i, text)
		}
		if res.IsError {
			if failed < 5 {
				t.Logf("call %d: %.200s", i, text)
			}
			failed++
			continue
		}
		ok++
	}
	s.halt(t)
	t.Logf("%d swaps: %d calls copied, %d refused or failed", s.swaps.Load(), ok, failed)
	s.outsideUntouched(t)
	if ok == 0 {
		t.Fatalf("the race proved nothing: no call succeeded over %d swaps", s.swaps.Load())
	}
	err := filepath.WalkDir(s.root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || !strings.HasSuffix(p, ".bin") {
			return err
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, payload) {
			t.Errorf("%s holds %d bytes, not the payload", p, len(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := liveMachines(drv); n != 0 {
		t.Errorf("%d machines still run", n)
	}
}
