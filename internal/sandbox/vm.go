package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/vmm"
)

// exitWait is how long stopping a VM waits for the VMM to exit on its own
// (after a halt) before killing it.
const exitWait = 300 * time.Millisecond

// vm owns one VM's life: its network (when it has one), the VMM process
// and the agent client on its channel. Every path that starts a VMM (a cold
// boot, a resume, a snapshot build) goes through one, so that every exit
// path ends all three. Methods are safe to call more than once.
//
// The network outlives a machine that is dropped and replaced (a resume
// that failed before a cold boot); close ends everything.
type vm struct {
	log *slog.Logger

	mu      sync.Mutex // guards following
	net     *runNetwork
	machine vmm.Machine
	client  *agentclient.Client
	netDone bool
}

// attach makes m the VM's machine and opens the agent client on its
// channel. A previous machine must have been dropped.
func (v *vm) attach(m vmm.Machine) *agentclient.Client {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.machine = m
	v.client = agentclient.New(m.Agent(), v.log)
	return v.client
}

// current returns the machine and client, nil before attach or after drop.
func (v *vm) current() (vmm.Machine, *agentclient.Client) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.machine, v.client
}

// hello runs fn (a wait for the guest's hello, or an explicit round trip)
// and fails early, naming how the VMM ended, when the VMM exits first.
func (v *vm) hello(ctx context.Context, fn func(*agentclient.Client, context.Context) (agentproto.Hello, error)) (agentproto.Hello, error) {
	m, c := v.current()
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

// kill ends the VMM at once without waiting. Idempotent.
func (v *vm) kill() {
	if m, _ := v.current(); m != nil {
		m.Kill()
	}
}

// stop waits up to exitWait for the VMM to exit on its own (after a halt),
// then kills it, waits for it and closes the client. The network stays.
// Idempotent.
func (v *vm) stop() {
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

// drop kills the VMM, waits for it and closes the client, keeping the
// network for another machine. Idempotent.
func (v *vm) drop() {
	v.kill()
	v.stop()
}

// closeNet ends every flow of the network and reports whether this call
// closed it (false: no network, or already closed). Idempotent.
func (v *vm) closeNet() bool {
	v.mu.Lock()
	n, done := v.net, v.netDone
	v.netDone = true
	v.mu.Unlock()
	if n == nil || done {
		return false
	}
	n.close()
	return true
}

// close ends the VM: the VMM killed and reaped, the client and the network
// closed. Idempotent.
func (v *vm) close() {
	v.drop()
	v.closeNet()
}
