package machine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// A snapshot VM's life up to its snapshot: booted cold with its disk
// slots backed by placeholders (BootForSnapshot), its network settled and,
// for an assembled snapshot, its root assembled and its exec path warmed
// (PrepareForSnapshot); then Snapshot writes it. The warm-pool catalog
// (internal/warmpool) publishes what it wrote.

// BootForSnapshot starts a snapshot VM of cfg and waits for its agent's
// hello; started (nil: none) is called once the VMM runs. It fails when
// the guest could not assemble its root or the VMM cannot snapshot. The
// caller drops v.
func (v *Machine) BootForSnapshot(ctx context.Context, drv vmm.Driver, cfg vmm.Config, started func(vmm.Machine)) (vmm.Machine, error) {
	m, err := v.Start(ctx, drv, cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the snapshot VM: %w", err)
	}
	if started != nil {
		started(m)
	}
	h, err := v.Hello(ctx, (*agentclient.Client).WaitHello)
	if err != nil {
		return nil, fmt.Errorf("waiting for the snapshot VM's agent: %w", err)
	}
	if h.BootError != "" {
		return nil, fmt.Errorf("the snapshot VM could not assemble its root (%s): %w", h.BootError, errdefs.ErrFailedPrecondition)
	}
	if _, ok := m.(vmm.Snapshotter); !ok {
		return nil, fmt.Errorf("the VMM cannot snapshot: %w", errdefs.ErrNotSupported)
	}
	return m, nil
}

// CloneForSnapshot starts a snapshot VM as a clone of the snapshot in dir
// (cfg gives it RAM of its own, which a snapshot can be taken of), made its
// own with hostname (MakeOwn); started is called once the VMM runs. The
// caller drops v, also on failure.
func (v *Machine) CloneForSnapshot(ctx context.Context, drv vmm.Restorer, cfg vmm.Config, dir, hostname string, started func(vmm.Machine)) (vmm.Machine, error) {
	m, err := v.Restore(ctx, drv, cfg, dir)
	if err != nil {
		return nil, fmt.Errorf("restoring the snapshot VM: %w", err)
	}
	started(m)
	if err := v.Greet(ctx); err != nil {
		return nil, err
	}
	if _, err := v.MakeOwn(ctx, hostname); err != nil {
		return nil, err
	}
	v.mu.Lock()
	v.shellRead = true
	v.mu.Unlock()
	return m, nil
}

// FitSlots cuts the writable slots of a snapshot VM that runs on as a
// run's VM (SnapshotRunning) to what the run may write, before the run's
// command: an unused slot's placeholder (SnapshotPlaceholders, SlotBytes)
// to nothing, and a scratch disk grown to SlotBytes for the boot to
// scratchBytes (0: not grown). Its guest, which saw each slot as
// SlotBytes, then writes no more past its files' ends than a clone's. d
// are the disks in its slots.
func (v *Machine) FitSlots(ctx context.Context, d Disks, scratchBytes int64) error {
	m, _ := v.Current()
	r, ok := m.(vmm.DiskResizer)
	if !ok {
		return fmt.Errorf("the VMM cannot cut the snapshot VM's disk slots: %w", errdefs.ErrNotSupported)
	}
	fit := map[int]int64{}
	switch {
	case d.Scratch == "":
		fit[slotScratch] = 0
	case scratchBytes > 0:
		fit[slotScratch] = scratchBytes
	}
	if d.WorkspaceUpper == "" {
		fit[slotWorkspaceUpper] = 0
	}
	for i, size := range fit {
		if err := r.ResizeDisk(ctx, i, size); err != nil {
			return fmt.Errorf("cutting the snapshot VM's disk slots: %w", err)
		}
	}
	return nil
}

// PrepareForSnapshot readies a booted snapshot VM for its snapshot
// (PrepareSnapshot) and, for an assembled snapshot (root not nil),
// assembles its root from root after the network, as a cold boot's root
// (the resolver goes in), with its stage's tree read into the guest's
// caches (up to 2048 entries: agentproto.Mount.Prefetch), and warms its
// exec path.
func (v *Machine) PrepareForSnapshot(ctx context.Context, root *Disks, deadline time.Time, log *slog.Logger) error {
	if err := v.PrepareSnapshot(ctx); err != nil || root == nil {
		return err
	}
	m := root.Mount("", false, deadline)
	m.Prefetch = 2048
	if err := v.mount(ctx, m, deadline); err != nil {
		return fmt.Errorf("assembling the snapshot VM's root: %w", err)
	}
	v.warmExec(ctx, log)
	return nil
}

// warmExec runs, in an assembled snapshot's VM, the commands nearly every
// run starts with, so that a clone finds the root's lookups and the exec
// path cached, and waits for the agent to have cleaned up after them
// (Settle), which no clone should do. They write nothing to the root.
func (v *Machine) warmExec(ctx context.Context, log *slog.Logger) {
	for _, argv := range [][]string{{"true"}, {"sh", "-c", ":"}} {
		_, err := v.Exec(ctx, Exec{Argv: argv, Env: []string{"PATH=" + warmPath}, Cwd: "/",
			Timeout: 10 * time.Second, Stdout: io.Discard, Stderr: io.Discard})
		log.Debug("warm pool: warming the exec path", "argv", argv, "err", err)
	}
	if c, err := v.agent(); err == nil {
		err = c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindSettle}, nil)
		log.Debug("warm pool: settled", "err", err)
	}
}

const warmPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" // the warm-up's PATH
