package machine_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// fakeConfig is a VM for vmmfake: files that exist where the kernel and a
// disk would be, and a directory.
func fakeConfig(t *testing.T) vmm.Config {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"vmlinuz", "root.img"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return vmm.Config{ID: "vm-0000000a", Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"),
		VCPUs: 1, MemMiB: 128, Disks: []vmm.Disk{{Path: filepath.Join(dir, "root.img"), Serial: "root", ReadOnly: true}}}
}

// bootFake boots a Machine on a vmmfake driver and checks, when the test
// ends, that no fake VMM is left running.
func bootFake(t *testing.T, fc vmmfake.Config) (*machine.Machine, *vmmfake.Driver) {
	t.Helper()
	drv, err := vmmfake.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	m := machine.New(nil)
	t.Cleanup(func() {
		m.Close()
		for _, fm := range drv.Machines() {
			select {
			case <-fm.Done():
			default:
				t.Errorf("machine %s still runs after Close", fm.Config().ID)
				fm.Kill()
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Boot(ctx, drv, fakeConfig(t)); err != nil {
		t.Fatalf("Boot: %v", err)
	}
	return m, drv
}

// TestExecManyTimes: one booted Machine runs three commands, each with
// its own environment, timeout and streams, and each result is its own;
// Halt then ends the VMM.
func TestExecManyTimes(t *testing.T) {
	m, drv := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.Configure(ctx); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	runExecs(t, ctx, m, []execCase{
		{"env", machine.Exec{Argv: []string{"/bin/sh", "-c", `echo "$GREETING"`}, Env: []string{"GREETING=hello", "PATH=/usr/bin:/bin"},
			Cwd: "/", Timeout: 10 * time.Second}, 0, false, "hello\n", ""},
		{"timeout", machine.Exec{Argv: []string{"/bin/sh", "-c", "echo started; exec sleep 30"}, Env: []string{"PATH=/usr/bin:/bin"},
			Cwd: "/", Timeout: 300 * time.Millisecond}, -1, true, "started\n", ""},
		{"exit code and stderr", machine.Exec{Argv: []string{"/bin/sh", "-c", `echo "$ONLY_HERE ${GREETING:-unset}" >&2; exit 3`},
			Env: []string{"ONLY_HERE=third"}, Cwd: "/", Timeout: 10 * time.Second}, 3, false, "", "third unset\n"},
	})
	if len(drv.Machines()) != 1 {
		t.Errorf("%d VMMs started; want one for all three commands", len(drv.Machines()))
	}
	if err := m.Halt(ctx, 5*time.Second); err != nil {
		t.Errorf("Halt: %v", err)
	}
	// Halt kills the VMM once the guest has answered (synced): the guest
	// may have powered off first or not.
	if vm := drv.Machines()[0]; vm.State().Syncs != 1 {
		t.Errorf("the guest synced %d times before its halt; want once", vm.State().Syncs)
	} else if err := vm.Wait(); err != nil && !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("the VMM stopped with %v after Halt; want a halt", err)
	}
	if _, err := m.Exec(ctx, machine.Exec{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec after Halt: %v; want a failed precondition", err)
	}
}

// execCase is one command on a booted Machine and what it must give.
type execCase struct {
	name      string
	e         machine.Exec
	code      int // -1: none (timed out)
	timedOut  bool
	out, errs string
}

// runExecs runs each case on m, one after the other, and checks that each
// result is the case's own.
func runExecs(t *testing.T, ctx context.Context, m *machine.Machine, cases []execCase) {
	t.Helper()
	for _, tt := range cases {
		var out, errs bytes.Buffer
		tt.e.Stdout, tt.e.Stderr = &out, &errs
		res, err := m.Exec(ctx, tt.e)
		if err != nil {
			t.Fatalf("%s: Exec: %v", tt.name, err)
		}
		code := -1
		if res.ExitCode != nil {
			code = *res.ExitCode
		}
		if code != tt.code || res.TimedOut != tt.timedOut || out.String() != tt.out || errs.String() != tt.errs {
			t.Errorf("%s: exit %d timed out %v stdout %q stderr %q; want %d %v %q %q",
				tt.name, code, res.TimedOut, out.String(), errs.String(), tt.code, tt.timedOut, tt.out, tt.errs)
		}
		if res.Elapsed <= 0 || (tt.timedOut && res.Elapsed < tt.e.Timeout) {
			t.Errorf("%s: elapsed %v", tt.name, res.Elapsed)
		}
	}
}

// TestBootError: a guest that reports it could not assemble its root
// fails Boot with a *BootError, a failed precondition.
func TestBootError(t *testing.T) {
	drv, err := vmmfake.New(vmmfake.Config{BootError: "no root disk"})
	if err != nil {
		t.Fatal(err)
	}
	m := machine.New(nil)
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = m.Boot(ctx, drv, fakeConfig(t))
	var be *machine.BootError
	if !errors.As(err, &be) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no root disk") {
		t.Errorf("Boot: %v; want a BootError naming the reason", err)
	}
}

// TestSnapshotAndResume: a booted Machine is snapshotted (its VMM ends),
// and a second Machine resumes from the snapshot, is made its own and
// runs commands.
func TestSnapshotAndResume(t *testing.T) {
	m, drv := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.PrepareSnapshot(ctx); err != nil {
		t.Fatalf("PrepareSnapshot: %v", err)
	}
	snap := t.TempDir()
	if err := m.Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	select {
	case <-drv.Machines()[0].Done():
	case <-ctx.Done():
		t.Fatal("the snapshotted VMM still runs")
	}
	m.Drop()

	r := machine.New(nil)
	defer r.Close()
	if _, err := r.Restore(ctx, drv, fakeConfig(t), snap); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := r.Greet(ctx); err != nil {
		t.Fatalf("Greet: %v", err)
	}
	if _, err := r.MakeOwn(ctx, "second"); err != nil {
		t.Fatalf("MakeOwn: %v", err)
	}
	var out bytes.Buffer
	res, err := r.Exec(ctx, machine.Exec{Argv: []string{"/bin/echo", "resumed"}, Cwd: "/", Timeout: 10 * time.Second, Stdout: &out})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || out.String() != "resumed\n" {
		t.Errorf("Exec after resume: %+v %v, stdout %q", res, err, out.String())
	}
	if err := r.Halt(ctx, 5*time.Second); err != nil {
		t.Errorf("Halt: %v", err)
	}
}
