package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session/supervisor"
	"isopod/internal/vmm/vmmfake"
)

// writerAt is a bytes.Buffer written at offsets, for GetFile.
type writerAt struct{ b []byte }

func (w *writerAt) WriteAt(p []byte, off int64) (int, error) {
	if end := int(off) + len(p); end > len(w.b) {
		w.b = append(w.b, make([]byte, end-len(w.b))...)
	}
	copy(w.b[off:], p)
	return len(p), nil
}

// A held VM boots once and serves several execs, jobs and file copies,
// then Close ends its VMM.
func TestStartVM(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.StartVM(ctx, sandbox.Request{NoNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	v := supervisor.NewVM(h)
	if info := h.Info(); info.VMID == "" || info.Path != "cold" || info.BootMS == nil {
		t.Errorf("info %+v; want a cold-booted VM with an id", info)
	}
	rep, err := v.Exec(ctx, supervisor.ExecRequest{Argv: []string{"echo out; exit 3"}, Shell: true, Cwd: "/"})
	if err != nil || code2(rep.ExitCode) != 3 || rep.Stdout != "out\n" || rep.TimedOut {
		t.Fatalf("exec: %+v, %v; want exit 3 and out", rep, err)
	}
	rep, err = v.Exec(ctx, supervisor.ExecRequest{Argv: []string{"sleep", "5"}, Cwd: "/", TimeoutS: 1})
	if err != nil || !rep.TimedOut {
		t.Fatalf("exec past its timeout: %+v, %v; want timed out", rep, err)
	}
	rep, err = v.Exec(ctx, supervisor.ExecRequest{Argv: []string{"true"}, Cwd: "/"})
	if err != nil || code2(rep.ExitCode) != 0 {
		t.Fatalf("exec after a timeout: %+v, %v; want exit 0", rep, err)
	}
	job, err := v.StartJob(ctx, supervisor.ExecRequest{Argv: []string{"echo job"}, Shell: true, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := v.JobWait(ctx, job.ID, 10*time.Second)
	if err != nil || string(out.Stdout) != "job\n" || out.ExitCode == nil {
		t.Errorf("job: %+v, %v; want job and an exit", out, err)
	}
	// The fake's guest is the host: the copies land in a test directory.
	p := filepath.Join(t.TempDir(), "f")
	if _, err := v.PutFile(ctx, p, 0o600, 1<<20, bytes.NewReader([]byte("data"))); err != nil {
		t.Fatal(err)
	}
	var w writerAt
	if _, err := v.GetFile(ctx, p, 1<<20, &w); err != nil || string(w.b) != "data" {
		t.Errorf("get: %q, %v; want data", w.b, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Error(err)
	}
	if v.Execs() != 4 {
		t.Errorf("%d execs; want 4", v.Execs())
	}
	h.Close()
	s.Wait()
	for _, m := range d.Machines() {
		select {
		case <-m.Done():
		case <-time.After(10 * time.Second):
			t.Error("the VMM still runs after Close")
		}
	}
}

// What belongs to a run's one command is refused before any VM starts.
func TestStartVMRefusesRunFields(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	for _, req := range []sandbox.Request{
		{Argv: []string{"true"}},
		{CommitAs: "x"},
		{CopyOut: []sandbox.CopyOut{{Guest: "/a", Host: "/tmp/a"}}},
		{VCPUs: 3},
	} {
		if _, err := s.StartVM(context.Background(), req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("StartVM(%+v): %v; want invalid argument", req, err)
		}
		if err := s.CheckVM(context.Background(), req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckVM(%+v): %v; want invalid argument", req, err)
		}
	}
	if err := s.CheckVM(context.Background(), sandbox.Request{Base: "no-such-base"}); err == nil {
		t.Error("CheckVM of a base that is not here: no error")
	}
	if err := s.CheckVM(context.Background(), sandbox.Request{NoNetwork: true}); err != nil {
		t.Errorf("CheckVM of a good request: %v", err)
	}
	if n := len(d.Machines()); n != 0 {
		t.Errorf("%d machines started; want none", n)
	}
}

func code2(c *int) int {
	if c == nil {
		return -1
	}
	return *c
}

// A guest that dies during an exec gives a report that says so, not an
// error.
func TestHeldGuestDies(t *testing.T) {
	t.Parallel()
	const marker = "die-here"
	panicked := errors.New("Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009")
	s, _ := newColdServiceWith(t, vmmfake.Config{OnRequest: func(m *vmmfake.Machine, msg *agentproto.Msg) {
		if msg.Kind == agentproto.KindExec && slices.ContainsFunc(msg.Exec.Argv, func(a string) bool { return strings.Contains(a, marker) }) {
			go m.Crash(panicked)
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.StartVM(ctx, sandbox.Request{NoNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	v := supervisor.NewVM(h)
	rep, err := v.Exec(ctx, supervisor.ExecRequest{Argv: []string{"sleep 30 # " + marker}, Shell: true, Cwd: "/"})
	if err != nil {
		t.Fatalf("Exec: %v; want a report", err)
	}
	if !rep.GuestDied || rep.ExitCode != nil || !strings.HasPrefix(rep.GuestDiedReason, "kernel panic") {
		t.Errorf("report %+v; want the guest's death and its reason", rep)
	}
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Error("Done not closed after the guest died")
	}
}

func newColdServiceWith(t *testing.T, cfg vmmfake.Config) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFakeWith(t, cfg, func(o *sandbox.Options) { o.NoWarmPool = true })
}
