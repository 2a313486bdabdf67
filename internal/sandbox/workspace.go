package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/report"
	"isopod/internal/workspace"
)

// A workspace carries a host directory into the run as a point-in-time
// copy (internal/workspace packs it into a squashfs), writable in the
// guest through a layer of its own that is never committed, and brings
// what the command changed back as a patch the caller may apply. isopod
// never writes the host tree.

// packWorkspace copies and packs the workspace, before the VM starts: a
// tree over a cap is refused here. The time it takes is not charged to the
// run's timeout, which is the command's.
func (r *run) packWorkspace(ctx context.Context) error {
	w := r.req.Workspace
	if w == nil {
		return nil
	}
	t := time.Now()
	defer func() { r.uncharged += time.Since(t) }()
	dir, err := w.Open()
	if err != nil {
		return err
	}
	defer dir.Close()
	work := workspace.WorkDir(r.dir.Rec.ID, r.dir.Path(), w.Options)
	tree, err := workspace.Pack(ctx, dir, work, w.Options)
	if err != nil {
		return fmt.Errorf("workspace %s: %w", w.Host, err)
	}
	r.ws = tree
	r.s.log.Debug("workspace packed", "work", work, "copy_ms", tree.CopyTime.Milliseconds(), "pack_ms", tree.PackTime.Milliseconds(), "ms", time.Since(t).Milliseconds())
	upper := filepath.Join(r.dir.Path(), "workspace-upper.ext4")
	if err := r.s.prepareScratch(upper, r.plan.scratchMiB); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	r.wsUpper = upper
	r.rep.Workspace = &report.Workspace{
		Host: w.Host, Guest: w.Guest, Git: tree.Git, Files: tree.Files, Bytes: tree.Bytes,
		Skipped: tree.Skipped, CredentialsRemoved: tree.CredentialsRemoved, Out: w.Out,
		InMS: time.Since(t).Milliseconds(),
	}
	return nil
}

// workspaceDir is the guest directory of the run's workspace ("" none).
func (r *run) workspaceDir() string {
	if r.ws == nil {
		return ""
	}
	return r.req.Workspace.Guest
}

// closeWorkspace removes the copy, its image and its writable layer.
func (r *run) closeWorkspace() {
	if r.ws != nil {
		if err := r.ws.Close(); err != nil {
			r.s.log.Warn("removing the workspace copy", "err", err)
		}
	}
	if r.wsUpper != "" {
		os.Remove(r.wsUpper)
	}
	r.req.Workspace.Release()
	if (r.req.Workspace != nil || r.resumedFrom != nil && r.resumedFrom.Workspace) && r.dir != nil {
		workspace.RemoveWork(r.dir.Rec.ID)
	}
}
