// Package hostio confines the host files a front end reads and writes for
// a run: the stdin file, copy-out destinations and the workspace. A path is
// resolved beneath a root one component at a time, each opened relative to
// a descriptor of the directory before it (beneath.go), and the open
// descriptors are what the core reads from and writes into, so what was
// checked is what is used. The MCP server's policy (Policy: Local,
// Remote) is confined to a root and never touches the state root; the
// CLI's (Operator) takes the operator's paths as named, refusing only what
// cannot be written or read as named.
package hostio

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/settings"
)

// MaxStdinFileBytes caps a stdin_file read through the MCP server.
const MaxStdinFileBytes = 4 << 20

// Policy is the policy for the arguments that name files on the host
// (stdin_file, copy_out[].host, workspace). The MCP server's is resolved
// once at start-up from its settings and flags; no tool argument can
// change it.
//
// Every accepted path is resolved beneath Root, one component at a time
// from a descriptor of the directory before it (see beneath.go), and never
// lies under the state root (Home), which is refused even when unconfined.
type Policy struct {
	// Root is the canonical confinement root. "/" means unconfined.
	Root string
	// Home is the isopod state root; anything under it is always refused.
	Home string
	// StdinFile and CopyOut switch each argument on.
	StdinFile bool
	CopyOut   bool
	// Workspace switches sandbox_run's workspace (and workspace_out,
	// which also needs CopyOut) on.
	Workspace bool
	// Remote marks the policy of a network listener, where host paths are
	// off unless the operator named a root (--host-io-root).
	Remote bool
	// RootSetting names what set Root, for refusals; empty: the working
	// directory or ISOPOD_MCP_HOST_IO_ROOT.
	RootSetting string
	// alias is the root as configured, when it differs from Root (a path
	// through a symlink): absolute paths under it are accepted too.
	alias string
	// rootErr, when set, makes every host path fail closed: the configured
	// root could not be used.
	rootErr error
}

// Local resolves the stdio server's policy from its settings, its working
// directory and the state root. The warnings are for the start-up log: a
// switch with an unknown value is read as off, and an empty root setting
// falls back to cwd.
func Local(s settings.HostIO, cwd, home string) (Policy, []string) {
	h := Policy{Home: canonicalOrAbs(home), StdinFile: s.StdinFile, CopyOut: s.CopyOut, Workspace: s.Workspace}
	warns := slices.Clone(s.Warnings)
	root, set := s.Root, s.RootSet
	if set && strings.TrimSpace(root) == "" {
		warns = append(warns, fmt.Sprintf("%s is set but empty; using the working directory", knobs.MCPHostIORoot))
		set = false
	}
	if !set {
		root = cwd
	}
	h.setRoot(root, knobs.MCPHostIORoot)
	if h.rootErr != nil {
		warns = append(warns, h.rootErr.Error())
	}
	return h, warns
}

// Remote is a network listener's policy: host paths are off unless the
// operator named a root (--host-io-root); then the settings' switches
// apply as on stdio.
func Remote(s settings.HostIO, root, home string) (Policy, []string) {
	h := Policy{Home: canonicalOrAbs(home), Remote: true, RootSetting: "--host-io-root"}
	if root == "" {
		return h, nil
	}
	h.StdinFile, h.CopyOut, h.Workspace = s.StdinFile, s.CopyOut, s.Workspace
	warns := slices.Clone(s.Warnings)
	h.setRoot(root, "--host-io-root")
	if h.rootErr != nil {
		warns = append(warns, h.rootErr.Error())
	}
	return h, warns
}

// setRoot makes root, named by setting, the confinement root, or records
// why it cannot be.
func (h *Policy) setRoot(root, setting string) {
	if !filepath.IsAbs(root) {
		h.rootErr = fmt.Errorf("%s=%q is not an absolute path; host file I/O is refused until it names an existing directory", setting, root)
		return
	}
	canon, err := filepath.EvalSymlinks(root)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(canon); err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	}
	if err != nil {
		h.rootErr = fmt.Errorf("host-I/O root %s is unusable (%v); host file I/O is refused until %s names an existing directory", root, err, setting)
		return
	}
	h.Root = canon
	if clean := filepath.Clean(root); clean != canon {
		h.alias = clean
	}
}

// String is the one start-up line stating the policy in force.
func (h Policy) String() string {
	where := "confined to " + h.Root
	switch {
	case h.Remote && h.Root == "" && h.rootErr == nil:
		where = "off (a network listener without --host-io-root)"
	case h.rootErr != nil:
		where = "refused (" + h.rootErr.Error() + ")"
	case h.Root == "/":
		where = "UNCONFINED (" + knobs.MCPHostIORoot + "=/)"
	}
	return fmt.Sprintf("host file I/O: %s; stdin_file=%s, copy_out=%s, workspace=%s; always refused under %s",
		where, onOff(h.StdinFile), onOff(h.CopyOut), onOff(h.Workspace), h.Home)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// HasRoot reports whether the policy has a usable root: without one every
// host path is refused.
func (h Policy) HasRoot() bool { return h.rootErr == nil && h.Root != "" }

// Disabled is the refusal of a host-path argument whose switch is off:
// what names the argument, instead the way to do without it.
func (h Policy) Disabled(what, instead string) error {
	if h.Remote {
		return fmt.Errorf("%s is off on this network listener: it names a file on the server, which a remote client does not own; %s (the operator can allow host files under a root with --host-io-root DIR): %w",
			what, instead, errdefs.ErrInvalidArgument)
	}
	knob := knobs.MCPStdinFile
	switch what {
	case "copy_out", "workspace_out":
		knob = knobs.MCPCopyOut
	case "workspace":
		knob = knobs.MCPWorkspace
	}
	return fmt.Errorf("%s is disabled on this server (%s=off); %s: %w", what, knob, instead, errdefs.ErrInvalidArgument)
}

// ReadStdinFile resolves a stdin_file argument beneath the root and reads
// it: a regular file with one link, outside the state root, at most
// MaxStdinFileBytes. The file read is the one the walk found (its device
// and inode are checked on the descriptor read from), whatever its path
// names by then.
func (h Policy) ReadStdinFile(arg string) (data []byte, resolved string, err error) {
	if !h.StdinFile {
		return nil, "", h.Disabled("stdin_file", "pass the input inline with stdin instead")
	}
	w, err := h.walk("stdin_file", arg, walkRead)
	if err != nil {
		return nil, "", err
	}
	defer w.close()
	if w.file == nil {
		return nil, "", fmt.Errorf("stdin_file %q does not exist: %w", arg, errdefs.ErrNotFound)
	}
	if err := h.checkReadable(arg, w); err != nil {
		return nil, "", err
	}
	fd, err := unix.Openat(int(w.dir.Fd()), w.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("stdin_file %q: opening %s: %v: %w", arg, w.path, err, errdefs.ErrInvalidArgument)
	}
	f := os.NewFile(uintptr(fd), w.path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != w.st.Dev || st.Ino != w.st.Ino {
		return nil, "", fmt.Errorf("stdin_file %q: %s was replaced while it was opened; try again: %w", arg, w.path, errdefs.ErrInvalidArgument)
	}
	data, err = io.ReadAll(io.LimitReader(f, MaxStdinFileBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("stdin_file %q: reading: %w", arg, err)
	}
	if len(data) > MaxStdinFileBytes {
		return nil, "", fmt.Errorf("stdin_file %q grew past the %d-byte (4 MiB) limit while being read: %w",
			arg, MaxStdinFileBytes, errdefs.ErrInvalidArgument)
	}
	return data, w.path, nil
}

// checkReadable checks what a stdin_file walk found, before it is opened
// for reading: a regular file (opening a FIFO or device can block or have
// side effects), one link, within the size cap.
func (h Policy) checkReadable(arg string, w *walked) error {
	mode := fileMode(w.st.Mode)
	if !mode.IsRegular() {
		return fmt.Errorf("stdin_file %q resolves to %s, which is not a regular file (%s); only regular files are accepted: %w",
			arg, w.path, agentproto.FileKind(mode), errdefs.ErrInvalidArgument)
	}
	if w.st.Nlink > 1 {
		return fmt.Errorf("stdin_file %q has %d hard links; a file with more than one link may be an alias of a file outside %s, so it is refused (copy it first): %w",
			arg, w.st.Nlink, h.Root, errdefs.ErrInvalidArgument)
	}
	if w.st.Size > MaxStdinFileBytes {
		return fmt.Errorf("stdin_file %q is %d bytes, over the %d-byte (4 MiB) limit; copy larger inputs in through a stage or the network: %w",
			arg, w.st.Size, MaxStdinFileBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ResolveCopyOut resolves a copy_out host destination beneath the root
// without creating anything, and returns the path the core will write.
// The destination must be new, a regular file, or a character device or
// FIFO (written straight through); its missing parents (created by
// OpenCopyOut) are allowed.
func (h Policy) ResolveCopyOut(arg string) (string, error) {
	w, err := h.copyOutWalk(arg, walkCheck)
	if err != nil {
		return "", err
	}
	w.close()
	return w.path, nil
}

// OpenCopyOut resolves a copy_out host destination beneath the root,
// creating its missing parent directories one by one relative to the
// directory before, and returns the path (for reports) and its parent
// directory, open: the core writes the file relative to that descriptor
// (sandbox.CopyOut.HostDir), so the write lands where the check was made
// whatever the path names by then. The caller closes dir.
func (h Policy) OpenCopyOut(arg string) (path string, dir *os.File, err error) {
	w, err := h.copyOutWalk(arg, walkCreate)
	if err != nil {
		return "", nil, err
	}
	if w.file != nil {
		w.file.Close()
	}
	return w.path, w.dir, nil
}

func (h Policy) copyOutWalk(arg string, mode walkMode) (*walked, error) {
	if !h.CopyOut {
		return nil, h.Disabled("copy_out", "print small results to stdout, or name guest files in read_files to get them back in the result")
	}
	w, err := h.walk("copy_out host path", arg, mode)
	if err != nil {
		return nil, err
	}
	// A character device or a FIFO is written straight through (the core
	// never renames a file onto it); anything else that is not a regular
	// file is refused.
	switch w.st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFCHR, unix.S_IFIFO:
	default:
		if w.file != nil {
			w.close()
			return nil, fmt.Errorf("copy_out host path %q resolves to %s, which exists and is %s; name a new or regular file, a character device or a FIFO: %w",
				arg, w.path, agentproto.FileKind(fileMode(w.st.Mode)), errdefs.ErrInvalidArgument)
		}
	}
	return w, nil
}

// fileMode converts a stat mode to an fs.FileMode's type bits.
func fileMode(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFLNK:
		return fs.ModeSymlink
	}
	return 0
}

// walk checks a host path argument's shape and resolves it beneath the
// root for mode, wording any refusal for what (the argument).
func (h Policy) walk(what, arg string, mode walkMode) (*walked, error) {
	if err := h.usable(what, arg); err != nil {
		return nil, err
	}
	w := &walker{root: h.Root, alias: h.alias, home: h.Home}
	comps := components(arg)
	if filepath.IsAbs(arg) {
		rel, ok := w.under(comps)
		if !ok {
			return nil, h.outside(what, arg, filepath.Clean(arg), "")
		}
		comps = rel
	}
	res, err := w.walk(comps, mode)
	if err == nil {
		return res, nil
	}
	var we *walkErr
	if !errors.As(err, &we) {
		return nil, fmt.Errorf("%s %q: %w", what, arg, err)
	}
	switch we.kind {
	case errOutside:
		return nil, h.outside(what, arg, we.path, we.detail)
	case errHome:
		return nil, fmt.Errorf("%s %q resolves to %s, inside the isopod state directory %s, which the MCP server never reads or writes: %w",
			what, arg, we.path, h.Home, errdefs.ErrInvalidArgument)
	case errMissing:
		return nil, fmt.Errorf("%s %q does not exist (%s is missing): %w", what, arg, we.path, errdefs.ErrNotFound)
	case errDangling:
		if mode == walkRead {
			return nil, fmt.Errorf("%s %q does not exist: %s %s: %w", what, arg, we.path, we.detail, errdefs.ErrNotFound)
		}
	case errSys:
		return nil, fmt.Errorf("%s %q: %s: %s: %w", what, arg, we.path, we.detail, errdefs.ErrInvalidArgument)
	}
	return nil, fmt.Errorf("%s %q: %s %s: %w", what, arg, we.path, we.detail, errdefs.ErrInvalidArgument)
}

// outside words a path that leads out of the root.
func (h Policy) outside(what, arg, resolved, why string) error {
	if why != "" {
		why = " (" + why + ")"
	}
	return fmt.Errorf("%s %q resolves to %s%s, outside the host-I/O root %s; use a path under %s (%s): %w",
		what, arg, resolved, why, h.Root, h.Root, h.rootSetting(), errdefs.ErrInvalidArgument)
}

// rootSetting says what sets the root, for refusals.
func (h Policy) rootSetting() string {
	if h.RootSetting != "" {
		return "the root is set by " + h.RootSetting
	}
	return "the root is the server's working directory unless " + knobs.MCPHostIORoot + " moves it"
}

// usable checks the policy and the shape of a host path argument.
func (h Policy) usable(what, arg string) error {
	if h.rootErr != nil {
		return fmt.Errorf("%s refused: %v: %w", what, h.rootErr, errdefs.ErrFailedPrecondition)
	}
	if h.Root == "" {
		// The zero policy fails closed.
		return fmt.Errorf("%s refused: this server has no host-I/O root (set %s to an existing directory): %w",
			what, knobs.MCPHostIORoot, errdefs.ErrFailedPrecondition)
	}
	switch {
	case arg == "":
		return fmt.Errorf("%s is empty; give a path under %s: %w", what, h.Root, errdefs.ErrInvalidArgument)
	case arg == "-":
		return fmt.Errorf("%s %q: \"-\" (the server's own stdin) is not accepted; pass input inline with stdin: %w", what, arg, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(arg, "~"):
		return fmt.Errorf("%s %q: \"~\" is not expanded; give an absolute path or one relative to %s: %w", what, arg, h.Root, errdefs.ErrInvalidArgument)
	case strings.ContainsRune(arg, 0):
		return fmt.Errorf("%s contains a NUL byte: %w", what, errdefs.ErrInvalidArgument)
	}
	return nil
}

// within reports whether p is root or lies below it. Both are clean,
// absolute paths.
func within(root, p string) bool {
	if root == "/" {
		return true
	}
	return p == root || strings.HasPrefix(p, root+"/")
}

// canonicalOrAbs resolves p through symlinks when it exists, else cleans it.
func canonicalOrAbs(p string) string {
	if p == "" {
		return ""
	}
	if c, err := filepath.EvalSymlinks(p); err == nil {
		return c
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return filepath.Clean(p)
}
