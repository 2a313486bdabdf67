//go:build linux

package workspace

import (
	"cmp"
	"errors"
	"fmt"
	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultGuestDir is where a workspace appears in the guest; it is the
// command's working directory unless the request names one.
const DefaultGuestDir = "/workspace"

// A Request is a run's workspace as its caller names it: the host
// directory, where it appears in the guest, the caps of the copy, and
// where the patch of its changes goes.
type Request struct {
	// Host is the host directory. Dir, when set, is that directory opened
	// by the caller (the MCP server opens it beneath its host-I/O root);
	// otherwise Host is opened, following symlinks as an operator expects.
	Host string
	Dir  *os.File
	// Guest is the guest directory; default DefaultGuestDir.
	Guest string
	// Options choose what is copied (All) and cap it.
	Options
	// Out, when set, is the host file that receives the patch; OutDir is
	// its directory opened by the caller, as CopyOut.HostDir.
	Out    string
	OutDir *os.File
	// Raise, when set, names the setting that raises a cap (by
	// LimitError's What), for a patch_error over one; the CLI
	// names its flags, the MCP server's caps are fixed.
	Raise func(what string) string `json:"-"`
	// opened: Dir was opened from Host by OpenHost; Release closes it.
	opened bool
}

// reservedGuestDirs are guest directories a workspace may not be, nor lie
// under.
var reservedGuestDirs = []string{"/proc", "/sys", "/dev", "/run/isopod"}

// Check fills the workspace's defaults and checks it before anything
// starts. The errors are errdefs.ArgErrors of the field "workspace" (or
// "workspace_out").
func (w *Request) Check() error {
	if w.Host == "" && w.Dir == nil {
		return errdefs.Arg("workspace", nil, "the host directory is empty")
	}
	w.Guest = cmp.Or(w.Guest, DefaultGuestDir)
	g := w.Guest
	if !strings.HasPrefix(g, "/") || path.Clean(g) != g || g == "/" {
		return errdefs.Arg("workspace", strconv.Quote(g), "the guest directory must be a clean absolute path other than / (default %s)", DefaultGuestDir)
	}
	for _, r := range reservedGuestDirs {
		if g == r || strings.HasPrefix(g, r+"/") {
			return errdefs.Arg("workspace", strconv.Quote(g), "the guest directory cannot be under %s, which the guest system owns", r)
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

// OpenHost opens the host directory of a workspace the caller gave by its
// path only, once, as the run is admitted: a missing one, or not a
// directory, is refused before a VM directory is made, and the copy is
// made from the directory opened here (Dir). The run closes it (Release).
// A nil Request has nothing to open.
func (w *Request) OpenHost() error {
	if w == nil || w.Dir != nil {
		return nil
	}
	d, err := w.Open()
	if err != nil {
		return err
	}
	w.Dir, w.opened = d, true
	return nil
}

// Release closes the host directory OpenHost opened. Idempotent; a nil
// Request has nothing to close.
func (w *Request) Release() {
	if w != nil && w.opened {
		w.Dir.Close()
		w.opened = false
	}
}

// Open opens the workspace's host directory: a duplicate of Dir when the
// caller opened it, else Host. The caller closes it.
func (w *Request) Open() (*os.File, error) {
	if w.Dir != nil {
		fd, err := unix.FcntlInt(w.Dir.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), w.Dir.Name()), nil
	}
	f, err := os.OpenFile(w.Host, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, errdefs.Arg("workspace", w.Host, "not a directory; name the directory to copy")
		}
		return nil, fmt.Errorf("%s %s: %w: %w", errdefs.CLIFlag("workspace"), w.Host, err, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// LinksOutWarning says that the patch at out makes symlinks pointing
// outside the repository (PatchStats.LinksOut), naming the first few.
func LinksOutWarning(out string, links []string) string {
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
