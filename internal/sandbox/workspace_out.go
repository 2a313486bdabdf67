package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/machine"
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
	wr.Changed = &WorkspaceChanged{Added: stats.Added, Modified: stats.Modified, Deleted: stats.Deleted}
	wr.LeftOut, wr.Ignored = stats.LeftOut, stats.Ignored
	wr.PatchBytes = &stats.Bytes
	if len(stats.LinksOut) > 0 {
		r.rep.Warnings = append(r.rep.Warnings, linksOutWarning(w.Out, stats.LinksOut))
	}
}

// linksOutWarning says that the patch at out makes symlinks pointing
// outside the repository, naming the first few.
func linksOutWarning(out string, links []string) string {
	const shown = 5
	names := make([]string, 0, shown)
	for _, l := range links[:min(len(links), shown)] {
		names = append(names, strconv.Quote(l))
	}
	more := ""
	if len(links) > shown {
		more = fmt.Sprintf(" and %d more", len(links)-shown)
	}
	return fmt.Sprintf("the workspace patch %s makes %d symlink(s) pointing outside the repository (%s%s); check them before applying it",
		out, len(links), strings.Join(names, ", "), more)
}

// writePatch lists the changes, copies the new content of changed files
// into the VM directory, makes the patch and publishes it.
func (r *run) writePatch(ctx context.Context) (workspace.PatchStats, error) {
	w := r.req.Workspace
	maxPatch := cmp.Or(w.MaxPatchBytes, workspace.DefaultMaxPatchBytes)
	changes, err := r.listChanges(ctx, cmp.Or(w.MaxFiles, workspace.DefaultMaxFiles), maxPatch)
	if err != nil {
		return workspace.PatchStats{}, err
	}
	content, err := os.MkdirTemp(r.dir.Path(), "workspace-out-")
	if err != nil {
		return workspace.PatchStats{}, fmt.Errorf("workspace patch: %w", err)
	}
	defer os.RemoveAll(content)
	if err := r.fetchChanged(ctx, changes, content, maxPatch); err != nil {
		return workspace.PatchStats{}, err
	}
	sf, err := machine.Stage(ctx, machine.GetFile{Host: w.Out, HostDir: w.OutDir, Staging: r.staging})
	if err != nil {
		return workspace.PatchStats{}, err
	}
	defer r.staging("")
	stats, err := r.ws.Patch(ctx, changes, &appendWriter{w: sf})
	if err != nil {
		sf.Abort()
		return stats, err
	}
	if err := sf.Commit(stats.Bytes, 0o644); err != nil {
		return stats, err
	}
	return stats, nil
}

// listChanges asks the guest what changed and turns its untrusted answer
// into changes: at most maxEntries, the new files among them (outside .git)
// holding at most maxContent bytes by the guest's own count. The content
// of each file is fetched later.
func (r *run) listChanges(ctx context.Context, maxEntries int, maxContent int64) ([]workspace.Change, error) {
	var (
		changes []workspace.Change
		content int64
	)
	err := r.vm.WorkspaceChanges(ctx, maxEntries, func(e agentproto.WorkspaceEntry) error {
		cs, err := changesOf(e)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.Kind != workspace.Deleted && c.Mode.IsRegular() && !workspace.LeftOut(c.Path) {
				content += max(e.Size, 0)
			}
		}
		if content > maxContent {
			return &workspace.LimitError{What: "changed bytes", Have: content, AtLeast: true, Limit: maxContent}
		}
		changes = append(changes, cs...)
		return nil
	})
	if err != nil {
		var le *workspace.LimitError
		if !errors.As(err, &le) && ctx.Err() == nil {
			err = fmt.Errorf("listing the workspace's changes: %w", err)
		}
		return nil, err
	}
	return changes, nil
}

// changesOf is what one entry of the guest's list means.
func changesOf(e agentproto.WorkspaceEntry) ([]workspace.Change, error) {
	kind := workspace.Added
	if e.InOriginal {
		kind = workspace.Modified
	}
	perm := fs.FileMode(e.Mode).Perm()
	switch e.Kind {
	case "deleted":
		return []workspace.Change{{Path: e.Path, Kind: workspace.Deleted}}, nil
	case "opaque":
		return []workspace.Change{{Path: e.Path, Kind: workspace.Deleted},
			{Path: e.Path, Kind: workspace.Added, Mode: fs.ModeDir | perm}}, nil
	case "dir":
		return []workspace.Change{{Path: e.Path, Kind: kind, Mode: fs.ModeDir | perm}}, nil
	case "symlink":
		return []workspace.Change{{Path: e.Path, Kind: kind, Mode: fs.ModeSymlink | 0o777, Target: e.Target}}, nil
	case "file":
		return []workspace.Change{{Path: e.Path, Kind: kind, Mode: perm}}, nil
	}
	return nil, fmt.Errorf("the guest listed %s with an unknown kind %s", strconv.Quote(e.Path), strconv.Quote(e.Kind))
}

// fetchChanged copies the new content of every changed regular file
// (outside .git) from the guest into dir, at most maxContent bytes of data
// in all, and points each change at its copy.
func (r *run) fetchChanged(ctx context.Context, changes []workspace.Change, dir string, maxContent int64) error {
	budget := maxContent
	for i := range changes {
		c := &changes[i]
		if c.Kind == workspace.Deleted || !c.Mode.IsRegular() || workspace.LeftOut(c.Path) {
			continue
		}
		if workspace.CheckPath(c.Path) != nil {
			continue // refused, with its reason, when the patch is made
		}
		name := filepath.Join(dir, strconv.Itoa(i))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("workspace patch: %w", err)
		}
		guest := path.Join(r.req.Workspace.Guest, c.Path)
		fd, err := r.vm.CopyOut(ctx, guest, agentclient.CopyLimits{MaxSize: maxContent, MaxData: budget}, f)
		if err == nil {
			err = f.Truncate(fd.Bytes)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("fetching the workspace's changed files: %w", err)
		}
		budget -= fd.Data
		c.Content = name
	}
	return nil
}

// appendWriter writes sequentially through a WriterAt.
type appendWriter struct {
	w interface {
		WriteAt([]byte, int64) (int, error)
	}
	off int64
}

func (a *appendWriter) Write(p []byte) (int, error) {
	n, err := a.w.WriteAt(p, a.off)
	a.off += int64(n)
	return n, err
}
