package machine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/pausefile"
	"isopod/internal/vmm"
)

// EntropyBytes is how much host randomness a resumed guest gets.
const EntropyBytes = 64

// Restore starts the Machine's VMM from the snapshot in dir (a previous
// VMM must have been dropped) and opens the agent client on its channel.
// cfg.Net is the Machine's network when it has one and cfg names none.
func (v *Machine) Restore(ctx context.Context, drv vmm.Restorer, cfg vmm.Config, dir string) (vmm.Machine, error) {
	if cfg.Net == nil && v.Net != nil {
		cfg.Net = v.Net.VMMNet()
	}
	m, err := drv.Restore(ctx, cfg, dir)
	if err != nil {
		return nil, err
	}
	v.Attach(m)
	return m, nil
}

// Greet says hello to a restored guest, which sends no Hello of its own.
// A guest that does not answer, or answers with a boot error, is dropped
// (the network stays).
func (v *Machine) Greet(ctx context.Context) error {
	h, err := v.Hello(ctx, (*agentclient.Client).Hello)
	if err == nil && h.BootError != "" {
		err = fmt.Errorf("the snapshot's guest reports a boot error: %s", h.BootError)
	}
	if err != nil {
		v.Drop()
	}
	return err
}

// MakeOwn makes a resumed clone its own machine before anything runs:
// fresh entropy mixed into the kernel pool with a CRNG reseed, the host's
// wall clock, hostname, and the Machine's network. The requests are
// independent and go out together. It returns the guest's address on the
// network ("" without one).
func (v *Machine) MakeOwn(ctx context.Context, hostname string) (guestIP string, err error) {
	return v.MakeOwnBoot(ctx, hostname, "")
}

// MakeOwnBoot is MakeOwn that also gives the guest the boot id bootID
// (a UUID; "" leaves the kernel's), with the other requests: for a clone
// whose guest ran before it was made its own (a ready VM).
func (v *Machine) MakeOwnBoot(ctx context.Context, hostname, bootID string) (guestIP string, err error) {
	c, err := v.agent()
	if err != nil {
		return "", err
	}
	type call struct {
		what    string
		msg     *agentproto.Msg
		payload []byte
	}
	entropy := make([]byte, EntropyBytes)
	rand.Read(entropy)
	calls := []call{
		{"adding entropy", &agentproto.Msg{Kind: agentproto.KindAddEntropy}, entropy},
		{"setting the guest clock", &agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: time.Now().UnixNano()}}, nil},
		{"setting the hostname", &agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: hostname}, nil},
	}
	if bootID != "" {
		calls = append(calls, call{"setting the boot id", &agentproto.Msg{Kind: agentproto.KindSetBootID, BootID: bootID}, nil})
	}
	if n := v.Net; n != nil {
		calls = append(calls, call{"configuring the guest network", &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: n.AgentConfig()}, nil})
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	t := time.Now()
	for i, cl := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Call(ctx, cl.msg, cl.payload); err != nil {
				errs[i] = fmt.Errorf("%s after resume: %w", cl.what, err)
			}
		}()
	}
	wg.Wait()
	v.log.Debug("warm pool: clone configured", "ms", time.Since(t).Milliseconds())
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	if n := v.Net; n != nil {
		return n.GuestIP(), nil
	}
	return "", nil
}

// Unpause lets a VMM restored paused (vmm.Config.Paused) run. A VMM that
// cannot resume a paused machine fails with errdefs.ErrNotSupported; on
// any failure the VMM is dropped (the network stays).
func (v *Machine) Unpause(ctx context.Context) error {
	m, _ := v.Current()
	res, ok := m.(vmm.Resumer)
	if !ok {
		v.Drop()
		return fmt.Errorf("the VMM cannot resume a paused machine: %w", errdefs.ErrNotSupported)
	}
	if err := res.Resume(ctx); err != nil {
		v.Drop()
		return err
	}
	return nil
}

// ResumePaused restores a paused VM (pausefile) from the snapshot in dir
// with cfg (RAM of its own: vmm.Config.OwnRAM) and makes the guest
// current: its clock, entropy, hostname and network (MakeOwn), a boot id
// of its own for a fork, its connection a session's. started is told of
// the VMM as soon as it runs. It returns how long the restore and the
// hello took (a warm run's resume_ms spans the same), and the restore
// alone. A failure once the guest ran on the pause's RAM file itself
// (cfg.RAMFile) is pausefile.ErrChanged too: the pause is not what it was.
func (v *Machine) ResumePaused(ctx context.Context, drv vmm.Restorer, cfg vmm.Config, dir string, fork bool,
	hostname string, started func(vmm.Machine)) (resumed, restore time.Duration, err error) {
	t := time.Now()
	if err := CutPlaceholders(cfg.Disks); err != nil {
		return 0, 0, err
	}
	m, err := v.Restore(ctx, drv, cfg, dir)
	if err != nil {
		return 0, 0, fmt.Errorf("restoring the paused VM: %w", err)
	}
	if cfg.RAMFile != "" && !cfg.Paused {
		defer func() {
			if err != nil {
				err = fmt.Errorf("%w (the guest ran on the pause's RAM: %w)", err, pausefile.ErrChanged)
			}
		}()
	}
	restore = time.Since(t)
	started(m)
	if err := v.Greet(ctx); err != nil {
		return 0, restore, fmt.Errorf("greeting the resumed VM: %w", err)
	}
	resumed = time.Since(t)
	if _, err := v.MakeOwn(ctx, hostname); err != nil {
		return 0, restore, err
	}
	if fork {
		if err := v.SetBootID(ctx, NewBootID()); err != nil {
			return 0, restore, err
		}
	}
	if err := v.Session(ctx); err != nil {
		return 0, restore, fmt.Errorf("marking the VM's connection a session's: %w", err)
	}
	return resumed, restore, nil
}

// NewBootID is a random (version 4) UUID, as the kernel makes a boot id.
func NewBootID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
