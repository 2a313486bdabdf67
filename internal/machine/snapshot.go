package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/pausefile"
	"isopod/internal/vmm"
)

// snapshotTimeout bounds writing a snapshot, and runOnTimeout letting a
// snapshotted VM run on.
const (
	snapshotTimeout = 2 * time.Minute
	runOnTimeout    = 30 * time.Second
)

// shellPrefetch are the files of its base a snapshot VM reads into its
// page cache, the first that reads: the shell, or its target where it is
// an absolute link the guest resolves outside the base (busybox's).
var shellPrefetch = []string{"/bin/sh", "/bin/busybox"}

// PrepareSnapshot does, in a guest that is to be snapshotted, what every
// clone would otherwise do first: the NIC brought up and addressed as
// every VM's private network, which a clone's agent then finds in force,
// and the shell read (shellPrefetch) unless the guest is a clone whose
// page cache holds it already (CloneForSnapshot). The snapshot may be
// taken at once: pending link events cost a clone nothing.
func (v *Machine) PrepareSnapshot(ctx context.Context) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	v.mu.Lock()
	shellRead := v.shellRead
	v.mu.Unlock()
	if n := v.Net; n != nil {
		nc := *n.AgentConfig()
		nc.Env = nil // a clone's own variables (proxies) are not the snapshot's
		if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &nc}, nil); err != nil {
			return fmt.Errorf("configuring the snapshot VM's network: %w", err)
		}
	}
	if shellRead {
		return nil
	}
	for _, f := range shellPrefetch {
		_, err := c.CopyOut(ctx, agentproto.BaseMountPoint+f, agentclient.CopyLimits{MaxSize: 64 << 20, MaxData: agentclient.NoLimit}, discardAt{})
		v.log.Debug("warm pool: prefetching the shell", "file", f, "err", err)
		if err == nil {
			break
		}
	}
	return nil
}

// Snapshot writes the running VM's snapshot into dir and kills the VMM: a
// snapshotted VM is not run on. It fails with errdefs.ErrNotSupported
// when the VMM cannot snapshot.
func (v *Machine) Snapshot(ctx context.Context, dir string) error {
	m, _ := v.Current()
	snapper, ok := m.(vmm.Snapshotter)
	if !ok {
		return fmt.Errorf("the VMM cannot snapshot: %w", errdefs.ErrNotSupported)
	}
	sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	if err := snapper.Snapshot(sctx, dir); err != nil {
		return err
	}
	m.Kill()
	return nil
}

// Pause writes the running VM's snapshot into dir (new and empty) with p
// as its descriptor, ends its VMM, and flushes the snapshot, the
// descriptor and the VM's writable disks to disk (pausefile.Paused.Sync).
// A VM whose RAM is a file of its own (vmm.Config.RAMFile) leaves that
// file itself as the snapshot's RAM (vmm.InPlaceSnapshotter): no copy,
// only the flush of what the guest changed. On failure the caller tears
// the VM down.
func (v *Machine) Pause(ctx context.Context, dir string, p *pausefile.Paused) error {
	t := time.Now()
	m, _ := v.Current()
	if in, ok := m.(vmm.InPlaceSnapshotter); ok {
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		err := in.SnapshotInPlace(sctx, dir)
		cancel()
		if err != nil {
			return err
		}
		m.Kill()
	} else if err := v.Snapshot(ctx, dir); err != nil {
		return err
	}
	tSnap := time.Since(t)
	if err := pausefile.Write(dir, p); err != nil {
		return err
	}
	err := p.Sync(dir)
	v.log.Debug("VM paused", "snapshot_ms", tSnap.Milliseconds(), "flush_ms", (time.Since(t) - tSnap).Milliseconds())
	return err
}

// discardAt is an io.WriterAt that keeps nothing.
type discardAt struct{}

func (discardAt) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// SnapshotRunning writes the running VM's snapshot into dir, runs
// between (the caller's copies of what must match the snapshot, the
// disks) while the guest is stopped, and lets the guest run on: a fork of
// a running VM. The VMM must have RAM of its own (a boot's, or a restore
// with vmm.Config.OwnRAM) and be a vmm.Resumer; else it fails with
// errdefs.ErrNotSupported and the guest runs on.
func (v *Machine) SnapshotRunning(ctx context.Context, dir string, between func() error) error {
	m, _ := v.Current()
	snapper, ok := m.(vmm.Snapshotter)
	res, ok2 := m.(vmm.Resumer)
	if !ok || !ok2 {
		return fmt.Errorf("the VMM cannot snapshot a running VM: %w", errdefs.ErrNotSupported)
	}
	sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	err := snapper.Snapshot(sctx, dir)
	if err == nil {
		err = between()
	}
	// The guest runs on whatever the snapshot's fate, and even once ctx
	// is done; a VMM that does not answer within runOnTimeout fails it.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), runOnTimeout)
	defer rcancel()
	if rerr := res.Resume(rctx); rerr != nil {
		return errors.Join(err, fmt.Errorf("letting the VM run on after its snapshot: %w", rerr))
	}
	return err
}

// SetBootID gives the guest a boot id of its own (a fork's).
func (v *Machine) SetBootID(ctx context.Context, id string) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindSetBootID, BootID: id}, nil); err != nil {
		return fmt.Errorf("setting the boot id: %w", err)
	}
	return nil
}
