package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"isopod/internal/machine"
	"isopod/internal/report"
	"isopod/internal/workspace"
)

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
	stats, err := r.writePatch(cctx)
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

// writePatch lists the changes, copies the new content of changed files
// into the VM directory, makes the patch and publishes it.
func (r *run) writePatch(ctx context.Context) (workspace.PatchStats, error) {
	w := r.req.Workspace
	maxPatch := cmp.Or(w.MaxPatchBytes, workspace.DefaultMaxPatchBytes)
	changes, err := r.vm.ListChanges(ctx, cmp.Or(w.MaxFiles, workspace.DefaultMaxFiles), maxPatch)
	if err != nil {
		return workspace.PatchStats{}, err
	}
	content, err := os.MkdirTemp(r.dir.Path(), "workspace-out-")
	if err != nil {
		return workspace.PatchStats{}, fmt.Errorf("workspace patch: %w", err)
	}
	defer os.RemoveAll(content)
	if err := r.vm.FetchChanged(ctx, changes, w.Guest, content, maxPatch); err != nil {
		return workspace.PatchStats{}, err
	}
	sf, err := machine.Stage(ctx, machine.GetFile{Host: w.Out, HostDir: w.OutDir, Staging: r.staging})
	if err != nil {
		return workspace.PatchStats{}, err
	}
	defer r.staging("")
	stats, err := r.ws.Patch(ctx, changes, machine.Appender(sf))
	if err != nil {
		sf.Abort()
		return stats, err
	}
	if err := sf.Commit(stats.Bytes, 0o644); err != nil {
		return stats, err
	}
	return stats, nil
}
