package machine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
)

// exitWait is how long stopping a VM waits for the VMM to exit on its own
// (after a halt) before killing it.
const exitWait = 300 * time.Millisecond

// Machine owns one VM's life: its network (when it has one), the VMM
// process and the agent client on its channel. Every path that starts a VMM
// (a cold boot, a resume, a snapshot build) goes through one, so that every
// exit path ends all three. Methods are safe to call more than once.
//
// The network outlives a VMM that is dropped and replaced (a resume that
// failed before a cold boot); Close ends everything.
type Machine struct {
	log *slog.Logger
	// Net is the VM's network (nil: none), set before its VMM starts.
	Net *vmnet.Network

	mu      sync.Mutex // guards following
	machine vmm.Machine
	client  *agentclient.Client
	netDone bool
	// shellRead: the VM is a clone of a snapshot whose VM read the shell
	// into its page cache (PrepareSnapshot), which the clone's holds too.
	shellRead bool
}

// New returns a Machine with no network and no VMM yet.
func New(log *slog.Logger) *Machine {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Machine{log: log}
}

// Attach makes m the VM's machine and opens the agent client on its
// channel. A previous machine must have been dropped.
func (v *Machine) Attach(m vmm.Machine) *agentclient.Client {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.machine, v.shellRead = m, false
	v.client = agentclient.New(m.Agent(), v.log)
	return v.client
}

// Current returns the machine and client, nil before attach or after drop.
func (v *Machine) Current() (vmm.Machine, *agentclient.Client) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.machine, v.client
}

// Hello runs fn (a wait for the guest's hello, or an explicit round trip)
// and fails early, naming how the VMM ended, when the VMM exits first.
func (v *Machine) Hello(ctx context.Context, fn func(*agentclient.Client, context.Context) (agentproto.Hello, error)) (agentproto.Hello, error) {
	m, c := v.Current()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	h, err := fn(c, ctx)
	if err != nil {
		select {
		case <-m.Done():
			return h, fmt.Errorf("the VM exited before its agent answered (%v): %w", m.Wait(), err)
		default:
		}
	}
	return h, err
}

// Kill ends the VMM at once without waiting. Idempotent.
func (v *Machine) Kill() {
	if m, _ := v.Current(); m != nil {
		m.Kill()
	}
}

// Stop waits up to exitWait for the VMM to exit on its own (after a halt),
// then kills it, waits for it and closes the client. The network stays.
// Idempotent.
func (v *Machine) Stop() {
	v.mu.Lock()
	m, c := v.machine, v.client
	v.machine, v.client = nil, nil
	v.mu.Unlock()
	if m != nil {
		select {
		case <-m.Done():
		case <-time.After(exitWait):
			m.Kill()
		}
		m.Wait()
	}
	if c != nil {
		c.Close()
	}
}

// Drop kills the VMM, waits for it and closes the client, keeping the
// network for another machine. Idempotent.
func (v *Machine) Drop() {
	v.Kill()
	v.Stop()
}

// CloseNet ends every flow of the network and reports whether this call
// closed it (false: no network, or already closed). Idempotent.
func (v *Machine) CloseNet() bool {
	v.mu.Lock()
	n, done := v.Net, v.netDone
	v.netDone = true
	v.mu.Unlock()
	if n == nil || done {
		return false
	}
	n.Close()
	return true
}

// Close ends the VM: the VMM killed and reaped, the client and the network
// closed. Idempotent.
func (v *Machine) Close() {
	v.Drop()
	v.CloseNet()
}
