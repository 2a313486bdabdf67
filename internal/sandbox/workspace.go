package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"isopod/internal/machine"
	"isopod/internal/report"
	"isopod/internal/workspace"
)

// A workspace carries a host directory into the run as a point-in-time
// copy (internal/workspace packs it into a squashfs), writable in the
// guest through a layer of its own that is never committed, and brings
// what the command changed back as a patch the caller may apply. isopod
// never writes the host tree.

// DefaultWorkspaceDir is where a workspace appears in the guest; it is the
// command's working directory unless the request names one.
const DefaultWorkspaceDir = "/workspace"

// Workspace is a run's workspace.
type Workspace struct {
	// Host is the host directory. Dir, when set, is that directory opened
	// by the caller (the MCP server opens it beneath its host-I/O root);
	// otherwise Host is opened, following symlinks as an operator expects.
	Host string
	Dir  *os.File
	// Guest is the guest directory; default DefaultWorkspaceDir.
	Guest string
	// Options choose what is copied (All) and cap it.
	workspace.Options
	// Out, when set, is the host file that receives the patch; OutDir is
	// its directory opened by the caller, as CopyOut.HostDir.
	Out    string
	OutDir *os.File
	// Raise, when set, names the setting that raises a cap (by
	// workspace.LimitError's What), for a patch_error over one; the CLI
	// names its flags, the MCP server's caps are fixed.
	Raise func(what string) string `json:"-"`
	// opened: Dir was opened from Host by the run (openHost), which
	// closes it.
	opened bool
}

// reservedGuestDirs are guest directories a workspace may not be, nor lie
// under.
var reservedGuestDirs = []string{"/proc", "/sys", "/dev", "/run/isopod"}

// checkWorkspace fills the workspace's defaults and checks it before
// anything starts.
func checkWorkspace(w *Workspace) error {
	if w.Host == "" && w.Dir == nil {
		return argError("workspace", nil, "the host directory is empty")
	}
	w.Guest = cmp.Or(w.Guest, DefaultWorkspaceDir)
	g := w.Guest
	if !strings.HasPrefix(g, "/") || path.Clean(g) != g || g == "/" {
		return argError("workspace", strconv.Quote(g), "the guest directory must be a clean absolute path other than / (default %s)", DefaultWorkspaceDir)
	}
	for _, r := range reservedGuestDirs {
		if g == r || strings.HasPrefix(g, r+"/") {
			return argError("workspace", strconv.Quote(g), "the guest directory cannot be under %s, which the guest system owns", r)
		}
	}
	if err := agentclient.CheckGuestPath("workspace", g); err != nil {
		return err
	}
	if err := w.Options.Validate(); err != nil {
		return err
	}
	if w.Out != "" && w.OutDir == nil {
		if err := (hostio.Operator{}).CheckCopyOut("workspace_out", w.Out); err != nil {
			return err
		}
	}
	return nil
}

// openHost opens the host directory of a workspace the caller gave by its
// path only, once, as the run is admitted: a missing one, or not a
// directory, is refused before a VM directory is made, and the copy is
// made from the directory opened here (Dir). The run closes it (release).
func (w *Workspace) openHost() error {
	if w == nil || w.Dir != nil {
		return nil
	}
	d, err := openWorkspace(w)
	if err != nil {
		return err
	}
	w.Dir, w.opened = d, true
	return nil
}

// release closes the host directory openHost opened. Idempotent.
func (w *Workspace) release() {
	if w != nil && w.opened {
		w.Dir.Close()
		w.opened = false
	}
}

// openWorkspace opens the workspace's host directory.
func openWorkspace(w *Workspace) (*os.File, error) {
	if w.Dir != nil {
		return machine.DupFile(w.Dir)
	}
	f, err := os.OpenFile(w.Host, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, argError("workspace", w.Host, "not a directory; name the directory to copy")
		}
		return nil, fmt.Errorf("%s %s: %w: %w", errdefs.CLIFlag("workspace"), w.Host, err, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

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
	dir, err := openWorkspace(w)
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
	r.req.Workspace.release()
	if (r.req.Workspace != nil || r.resumedFrom != nil && r.resumedFrom.Workspace) && r.dir != nil {
		workspace.RemoveWork(r.dir.Rec.ID)
	}
}
