package machine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/workspace"
)

// A workspace's changes, brought out of the guest for the patch the host
// makes (internal/workspace): the guest's list, checked, and the new
// content of every changed file.

// ListChanges asks the guest what changed and turns its untrusted answer
// into changes: at most maxEntries, the new files among them (outside .git)
// holding at most maxContent bytes by the guest's own count. The content
// of each file is fetched later.
func (v *Machine) ListChanges(ctx context.Context, maxEntries int, maxContent int64) ([]workspace.Change, error) {
	var (
		changes []workspace.Change
		content int64
	)
	err := v.WorkspaceChanges(ctx, maxEntries, func(e agentproto.WorkspaceEntry) error {
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

// FetchChanged copies the new content of every changed regular file
// (outside .git) of the workspace at the guest's root from the guest into
// dir, at most maxContent bytes of data in all, and points each change at
// its copy.
func (v *Machine) FetchChanged(ctx context.Context, changes []workspace.Change, root, dir string, maxContent int64) error {
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
		guest := path.Join(root, c.Path)
		fd, err := v.CopyOut(ctx, guest, agentclient.CopyLimits{MaxSize: maxContent, MaxData: budget}, f)
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

// Appender writes sequentially through w, from its start: the patch is
// written this way into a staged destination (Stage).
func Appender(w io.WriterAt) io.Writer { return &appendWriter{w: w} }

// appendWriter writes sequentially through a WriterAt.
type appendWriter struct {
	w   io.WriterAt
	off int64
}

func (a *appendWriter) Write(p []byte) (int, error) {
	n, err := a.w.WriteAt(p, a.off)
	a.off += int64(n)
	return n, err
}

// WorkspacePatch writes the patch of what the command changed in the
// workspace tree, mounted at guest, to out's host file (staged, as
// GetFile's), within opts' caps: the guest lists the changes, the new
// content of changed files is copied into a directory under dir, and the
// host makes the patch.
func (v *Machine) WorkspacePatch(ctx context.Context, tree *workspace.Tree, guest, dir string, opts workspace.Options, out GetFile) (workspace.PatchStats, error) {
	maxPatch := cmp.Or(opts.MaxPatchBytes, workspace.DefaultMaxPatchBytes)
	changes, err := v.ListChanges(ctx, cmp.Or(opts.MaxFiles, workspace.DefaultMaxFiles), maxPatch)
	if err != nil {
		return workspace.PatchStats{}, err
	}
	content, err := os.MkdirTemp(dir, "workspace-out-")
	if err != nil {
		return workspace.PatchStats{}, fmt.Errorf("workspace patch: %w", err)
	}
	defer os.RemoveAll(content)
	if err := v.FetchChanged(ctx, changes, guest, content, maxPatch); err != nil {
		return workspace.PatchStats{}, err
	}
	sf, err := Stage(ctx, out)
	if err != nil {
		return workspace.PatchStats{}, err
	}
	if out.Staging != nil {
		defer out.Staging("")
	}
	stats, err := tree.Patch(ctx, changes, Appender(sf))
	if err != nil {
		sf.Abort()
		return stats, err
	}
	if err := sf.Commit(stats.Bytes, 0o644); err != nil {
		return stats, err
	}
	return stats, nil
}
