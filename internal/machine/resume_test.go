package machine

import (
	"context"
	"net"
	"testing"
	"time"

	"isopod/internal/agent"
	"isopod/internal/agentclient"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/vmnet"
)

// TestMakeOwn drives the real agent protocol server (without a VM) with
// what a resumed clone is sent before its command.
func TestMakeOwn(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	sys := vmmfake.NewSystem()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agent.Serve(ctx, guestEnd, agent.Options{System: sys}) }()
	t.Cleanup(func() {
		cancel()
		hostEnd.Close()
		guestEnd.Close()
		<-served
	})
	n, err := vmnet.Start(vmnet.Config{Scope: "machinetest", ID: "vm-test", Dir: t.TempDir(), Start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	m := New(nil)
	m.Net = n
	m.client = agentclient.New(hostEnd, nil)
	t.Cleanup(func() { m.client.Close() })
	if _, err := m.client.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	ip, err := m.MakeOwn(ctx, "brave-otter")
	if err != nil {
		t.Fatal(err)
	}
	st := sys.State()
	if len(st.LastSeed) < 64 {
		t.Errorf("entropy: %d bytes; want at least 64", len(st.LastSeed))
	}
	if d := st.Clock.Sub(before); d < -time.Second || d > time.Second {
		t.Errorf("clock sent %v, %v off the host's", st.Clock, d)
	}
	if st.Hostname != "brave-otter" {
		t.Errorf("hostname %q", st.Hostname)
	}
	if st.Net == nil || st.Net.Address != n.AgentConfig().Address || ip == "" {
		t.Errorf("network: %+v, guest ip %q", st.Net, ip)
	}
	// Two resumes never get the same seed.
	if _, err := m.MakeOwn(ctx, "brave-otter"); err != nil {
		t.Fatal(err)
	}
	if string(st.LastSeed) == string(sys.State().LastSeed) {
		t.Error("two resumes sent the same entropy")
	}
}
