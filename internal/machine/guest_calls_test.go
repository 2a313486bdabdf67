package machine_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/vmnet"
)

// TestConfigureAndMount: Configure sets the guest's clock and, with a
// network, its settings, returning its address; Mount hands the guest its
// root once, and a second mount is refused.
func TestConfigureAndMount(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	m, drv := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := time.Now()
	if ip, err := m.Configure(ctx); err != nil || ip != "" {
		t.Fatalf("Configure without a network: %q, %v", ip, err)
	}
	st := drv.Machines()[0].State()
	if st.Clock.Before(before.Add(-time.Second)) || st.Net != nil {
		t.Errorf("guest state %+v; want the host's clock and no network", st)
	}
	n, err := vmnet.Start(vmnet.Config{Scope: "s", ID: "vm-conf", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	m.Net = n
	ip, err := m.Configure(ctx)
	if err != nil || ip != n.GuestIP() {
		t.Fatalf("Configure with a network: %q, %v; want %s", ip, err, n.GuestIP())
	}
	if st := drv.Machines()[0].State(); st.Net == nil || st.Net.Gateway != n.AgentConfig().Gateway {
		t.Errorf("guest network %+v; want the stack's", st.Net)
	}
	m.Net = nil

	d := machine.Disks{Base: "/img/base.sqfs", Layers: []string{"/l0"}, Scratch: "/vm/scratch.ext4"}
	if err := m.Mount(ctx, d, "/workspace", false, time.Now().Add(10*time.Second)); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if mt := drv.Machines()[0].State().Mount; mt == nil || mt.Layers != 1 || !mt.Scratch {
		t.Errorf("guest mount %+v; want one layer and the scratch disk", mt)
	}
	if err := m.Mount(ctx, d, "/workspace", false, time.Now().Add(10*time.Second)); err == nil {
		t.Errorf("a second Mount was accepted")
	}
}

// TestRestorePausedThenUnpause: a Machine restored paused greets and runs
// commands once Unpause let it run; a Machine without a VMM that can
// resume is not supported.
func TestRestorePausedThenUnpause(t *testing.T) {
	m, drv := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.PrepareSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	snap := t.TempDir()
	if err := m.Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	m.Drop()

	r := machine.New(nil)
	defer r.Close()
	cfg := fakeConfig(t)
	cfg.Paused = true
	if _, err := r.Restore(ctx, drv, cfg, snap); err != nil {
		t.Fatalf("Restore paused: %v", err)
	}
	if err := machine.New(nil).Unpause(ctx); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Unpause without a VMM: %v; want not supported", err)
	}
	if err := r.Unpause(ctx); err != nil {
		t.Fatalf("Unpause: %v", err)
	}
	if err := r.Greet(ctx); err != nil {
		t.Fatalf("Greet after Unpause: %v", err)
	}
	var out bytes.Buffer
	res, err := r.Exec(ctx, machine.Exec{Argv: []string{"/bin/echo", "unpaused"}, Cwd: "/", Timeout: 10 * time.Second, Stdout: &out})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || out.String() != "unpaused\n" {
		t.Errorf("Exec after Unpause: %+v %v, %q", res, err, out.String())
	}
}
