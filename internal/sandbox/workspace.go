package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/machine"
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

// workspaceOut writes the patch of what the command changed in the
// workspace to the requested host file, after the command (not after a
// timeout or a guest's death). Like copy-out it is bounded by the run's
// timeout, counted again. A patch that cannot be made (over its cap, a
// guest that lists nonsense) is reported in the workspace block and a
// warning; the destination is left as it was.
func (r *run) workspaceOut(ctx context.Context) {
	w := r.req.Workspace
	if r.ws == nil || w.Out == "" {
		return
	}
	t := time.Now()
	cctx, cancel := context.WithTimeout(ctx, time.Duration(r.req.TimeoutS)*time.Second)
	defer cancel()
	stats, err := r.vm.WorkspacePatch(cctx, r.ws, w.Guest, r.dir.Path(), w.Options,
		machine.GetFile{Host: w.Out, HostDir: w.OutDir, Staging: r.staging})
	ms := time.Since(t).Milliseconds()
	wr := r.rep.Workspace
	wr.OutMS = &ms
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("not finished within the run's timeout (%d s, counted again for the patch)", r.req.TimeoutS)
		}
		wr.PatchError = err.Error()
		var le *workspace.LimitError
		if errors.As(err, &le) && w.Raise != nil && w.Raise(le.What) != "" {
			wr.PatchError += ", or raise " + w.Raise(le.What)
		}
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("no workspace patch was written to %s: %s", w.Out, wr.PatchError))
		return
	}
	wr.Changed = &report.WorkspaceChanged{Added: stats.Added, Modified: stats.Modified, Deleted: stats.Deleted}
	wr.LeftOut, wr.Ignored = stats.LeftOut, stats.Ignored
	wr.PatchBytes = &stats.Bytes
	if len(stats.LinksOut) > 0 {
		r.rep.Warnings = append(r.rep.Warnings, workspace.LinksOutWarning(w.Out, stats.LinksOut))
	}
}
