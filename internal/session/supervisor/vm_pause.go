package supervisor

import (
	"context"
	"fmt"
	"os"
	"time"

	"isopod/internal/machine"
	"isopod/internal/paths"
	"isopod/internal/pausefile"
	"isopod/internal/vmrecord"
	"isopod/internal/workspace"
)

// A session's VM pauses and forks through the machine layer
// (machine.Machine.Pause, pausefile.Paused.CopyFiles) with what the core
// knows of it (sandbox.Held.Paused): the order of the steps, and what
// goes when one fails, are here.

// pauseResult is what a pause holds on disk: the bytes the snapshot's
// files and the VM's disks occupy (allocated blocks: holes are free).
type pauseResult struct {
	MemoryBytes int64
	DiskBytes   int64
	closeMS     int64 // the VM's teardown after its snapshot
}

// Pause writes the VM's state into dir (new and empty), ends its VMM and
// network and keeps its disks for sandbox.Service.ResumeVM. The VM is
// closed then, whatever the outcome; on failure it is torn down as by
// Close.
func (v *VM) Pause(ctx context.Context, dir string) (*pauseResult, error) {
	p, err := v.Paused(ctx)
	if err != nil {
		return nil, err
	}
	if err := v.Machine().Pause(ctx, dir, p); err != nil {
		v.Close()
		return nil, fmt.Errorf("pausing the VM: %w", err)
	}
	t := time.Now()
	v.ClosePaused()
	closeMS := time.Since(t).Milliseconds()
	mem, disks := p.Bytes(dir)
	return &pauseResult{MemoryBytes: mem, DiskBytes: disks, closeMS: closeMS}, nil
}

// Fork snapshots the running VM into dir (new and empty) for a copy,
// which sandbox.Service.ResumeVM brings up; the VM is stopped while its
// RAM and disks are copied, then runs on.
func (v *VM) Fork(ctx context.Context, pp paths.Paths, dir string) error {
	p, err := v.Paused(ctx)
	if err != nil {
		return err
	}
	err = v.Machine().SnapshotRunning(ctx, dir, func() error {
		child, err := copyPaused(pp, p)
		if err != nil {
			return err
		}
		return writeCopy(dir, child)
	})
	if err != nil {
		return fmt.Errorf("forking the VM: %w", err)
	}
	return nil
}

// forkPaused copies the pause in parentDir into dir (new and empty) for
// a copy of that VM, which sandbox.Service.ResumeVM brings up.
func forkPaused(pp paths.Paths, parentDir, dir string) error {
	p, err := pausefile.Read(parentDir)
	if err != nil {
		return err
	}
	if err := pausefile.CopySnapshot(dir, parentDir); err != nil {
		return fmt.Errorf("forking the paused VM: %w", err)
	}
	child, err := copyPaused(pp, p)
	if err != nil {
		return err
	}
	return writeCopy(dir, child)
}

// copyPaused makes a VM directory, marked paused, for a copy of the
// paused VM p, with copies of the files that go with p
// (pausefile.Paused.CopyFiles), and returns the copy's descriptor.
func copyPaused(pp paths.Paths, p *pausefile.Paused) (*pausefile.Paused, error) {
	rec, err := vmrecord.Read(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("forking the VM: %w", err)
	}
	d, err := vmrecord.NewDir(pp, rec.Argv, rec.Base, rec.Stage)
	if err != nil {
		return nil, err
	}
	c, err := p.CopyFiles(d.Rec.ID, d.Path())
	d.Pause()
	if err != nil {
		os.RemoveAll(d.Path())
		return nil, err
	}
	return c, nil
}

// writeCopy writes the descriptor of the copy c into dir, or removes
// what was copied for it.
func writeCopy(dir string, c *pausefile.Paused) error {
	if err := pausefile.Write(dir, c); err != nil {
		discardPaused(c)
		os.RemoveAll(c.Dir)
		return fmt.Errorf("forking the VM: %w", err)
	}
	return nil
}

// discardPaused removes what a pause kept of the paused VM p (its disks,
// its workspace copy) and finishes its VM's record; its snapshot
// directory is the caller's.
func discardPaused(p *pausefile.Paused) {
	machine.CleanDisks(p.Dir, p.Scratch)
	if p.WorkspaceUpper != "" {
		os.Remove(p.WorkspaceUpper)
	}
	if p.Workspace {
		workspace.RemoveWork(p.VMID)
	}
	if rec, err := vmrecord.Read(p.Dir); err == nil {
		rec.Paused, rec.Finished = false, true
		vmrecord.Write(p.Dir, rec)
	}
}
