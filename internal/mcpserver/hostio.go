package mcpserver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// MaxStdinFileBytes caps a stdin_file read through the MCP server.
const MaxStdinFileBytes = 4 << 20

// HostIO is the policy for the two sandbox_run arguments that name files on
// the host (stdin_file and copy_out[].host). It is resolved once at start-up
// from the server's own environment; no tool argument can change it.
//
// Every accepted path lies under Root after symlinks are resolved, and never
// under the state root (Home), which is refused even when unconfined.
type HostIO struct {
	// Root is the canonical confinement root. "/" means unconfined.
	Root string
	// Home is the isopod state root; anything under it is always refused.
	Home string
	// StdinFile and CopyOut switch each argument on.
	StdinFile bool
	CopyOut   bool
	// rootErr, when set, makes every host path fail closed: the configured
	// root could not be used.
	rootErr error
}

// HostIOFromEnv resolves the policy from environment lookups (os.LookupEnv
// in production), the server's working directory and the state root. The
// warnings are for the start-up log: a switch with an unknown value is read
// as off, and an empty root variable falls back to cwd.
func HostIOFromEnv(lookup func(string) (string, bool), cwd, home string) (HostIO, []string) {
	var warns []string
	h := HostIO{Home: canonicalOrAbs(home)}

	h.StdinFile, warns = readSwitch(lookup, knobs.MCPStdinFile, warns)
	h.CopyOut, warns = readSwitch(lookup, knobs.MCPCopyOut, warns)

	root, set := lookup(knobs.MCPHostIORoot)
	if set && strings.TrimSpace(root) == "" {
		warns = append(warns, fmt.Sprintf("%s is set but empty; using the working directory", knobs.MCPHostIORoot))
		set = false
	}
	if !set {
		root = cwd
	}
	switch {
	case !filepath.IsAbs(root):
		h.rootErr = fmt.Errorf("%s=%q is not an absolute path; host file I/O is refused until it names an existing directory", knobs.MCPHostIORoot, root)
	default:
		canon, err := filepath.EvalSymlinks(root)
		if err == nil {
			var fi os.FileInfo
			if fi, err = os.Stat(canon); err == nil && !fi.IsDir() {
				err = errors.New("not a directory")
			}
		}
		if err != nil {
			h.rootErr = fmt.Errorf("host-I/O root %s is unusable (%v); host file I/O is refused until %s names an existing directory", root, err, knobs.MCPHostIORoot)
		} else {
			h.Root = canon
		}
	}
	if h.rootErr != nil {
		warns = append(warns, h.rootErr.Error())
	}
	return h, warns
}

// readSwitch reads an on/off variable: unset means on; an unknown value
// means off, with a warning.
func readSwitch(lookup func(string) (string, bool), name string, warns []string) (bool, []string) {
	v, ok := lookup(name)
	if !ok {
		return true, warns
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "1", "true", "yes", "enabled", "":
		return true, warns
	case "off", "0", "false", "no", "disabled":
		return false, warns
	}
	return false, append(warns, fmt.Sprintf("%s=%q is not on or off; treating it as off", name, v))
}

// String is the one start-up line stating the policy in force.
func (h HostIO) String() string {
	where := "confined to " + h.Root
	switch {
	case h.rootErr != nil:
		where = "refused (" + h.rootErr.Error() + ")"
	case h.Root == "/":
		where = "UNCONFINED (" + knobs.MCPHostIORoot + "=/)"
	}
	return fmt.Sprintf("host file I/O: %s; stdin_file=%s, copy_out=%s; always refused under %s",
		where, onOff(h.StdinFile), onOff(h.CopyOut), h.Home)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ReadStdinFile resolves a stdin_file argument and reads it: a regular file
// under the root, at most MaxStdinFileBytes. The file is opened by its
// resolved name without following a final symlink and re-checked on the open
// descriptor, so a swap after the check cannot redirect the read.
func (h HostIO) ReadStdinFile(arg string) (data []byte, resolved string, err error) {
	if !h.StdinFile {
		return nil, "", fmt.Errorf("stdin_file is disabled on this server (%s=off); pass the input inline with stdin instead: %w",
			knobs.MCPStdinFile, errdefs.ErrInvalidArgument)
	}
	abs, err := h.absolute("stdin_file", arg)
	if err != nil {
		return nil, "", err
	}
	resolved, err = filepath.EvalSymlinks(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("stdin_file %q does not exist: %w", arg, errdefs.ErrNotFound)
		}
		return nil, "", fmt.Errorf("stdin_file %q cannot be resolved (%v): %w", arg, err, errdefs.ErrInvalidArgument)
	}
	if err := h.allowed("stdin_file", arg, resolved); err != nil {
		return nil, "", err
	}
	// Refuse a FIFO or device before opening it: opening one can block or
	// have side effects.
	if fi, err := os.Stat(resolved); err != nil || !fi.Mode().IsRegular() {
		kind := "unreadable"
		if err == nil {
			kind = kindOf(fi.Mode())
		}
		return nil, "", fmt.Errorf("stdin_file %q resolves to %s, which is not a regular file (%s); only regular files are accepted: %w",
			arg, resolved, kind, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(resolved, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, "", fmt.Errorf("stdin_file %q: opening %s: %v: %w", arg, resolved, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("stdin_file %q: %w", arg, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, "", fmt.Errorf("stdin_file %q resolves to %s, which is not a regular file (%s); only regular files are accepted: %w",
			arg, resolved, kindOf(fi.Mode()), errdefs.ErrInvalidArgument)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		return nil, "", fmt.Errorf("stdin_file %q has %d hard links; a file with more than one link may be an alias of a file outside %s, so it is refused (copy it first): %w",
			arg, st.Nlink, h.Root, errdefs.ErrInvalidArgument)
	}
	if fi.Size() > MaxStdinFileBytes {
		return nil, "", fmt.Errorf("stdin_file %q is %d bytes, over the %d-byte (4 MiB) limit; copy larger inputs in through a stage or the network: %w",
			arg, fi.Size(), MaxStdinFileBytes, errdefs.ErrInvalidArgument)
	}
	data, err = io.ReadAll(io.LimitReader(f, MaxStdinFileBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("stdin_file %q: reading: %w", arg, err)
	}
	if len(data) > MaxStdinFileBytes {
		return nil, "", fmt.Errorf("stdin_file %q grew past the %d-byte (4 MiB) limit while being read: %w",
			arg, MaxStdinFileBytes, errdefs.ErrInvalidArgument)
	}
	return data, resolved, nil
}

// ResolveCopyOut resolves a copy_out host destination to the path the core
// should write. The path is normalised (empty and "." components and trailing
// separators dropped), every existing component is resolved through
// symlinks, a dangling symlink is refused, and ".." is resolved only where
// the directory above exists. The result must lie under the root and outside
// the state root, and if it exists it must be a regular file.
func (h HostIO) ResolveCopyOut(arg string) (string, error) {
	if !h.CopyOut {
		return "", fmt.Errorf("copy_out is disabled on this server (%s=off); print small results to stdout instead: %w",
			knobs.MCPCopyOut, errdefs.ErrInvalidArgument)
	}
	abs, err := h.absolute("copy_out host", arg)
	if err != nil {
		return "", err
	}
	resolved, err := resolveForWrite(abs)
	if err != nil {
		return "", fmt.Errorf("copy_out host path %q: %v: %w", arg, err, errdefs.ErrInvalidArgument)
	}
	if err := h.allowed("copy_out host", arg, resolved); err != nil {
		return "", err
	}
	fi, err := os.Lstat(resolved)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return "", fmt.Errorf("copy_out host path %q resolves to %s, which exists and is not a regular file (%s); name a new or regular file: %w",
			arg, resolved, kindOf(fi.Mode()), errdefs.ErrInvalidArgument)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("copy_out host path %q: %v: %w", arg, err, errdefs.ErrInvalidArgument)
	}
	return resolved, nil
}

// absolute checks the shape of a host path argument and makes it absolute.
// A relative path is taken relative to the root.
func (h HostIO) absolute(what, arg string) (string, error) {
	if h.rootErr != nil {
		return "", fmt.Errorf("%s refused: %v: %w", what, h.rootErr, errdefs.ErrFailedPrecondition)
	}
	if h.Root == "" {
		// The zero policy fails closed.
		return "", fmt.Errorf("%s refused: this server has no host-I/O root (set %s to an existing directory): %w",
			what, knobs.MCPHostIORoot, errdefs.ErrFailedPrecondition)
	}
	switch {
	case arg == "":
		return "", fmt.Errorf("%s is empty; give a path under %s: %w", what, h.Root, errdefs.ErrInvalidArgument)
	case arg == "-":
		return "", fmt.Errorf("%s %q: \"-\" (the server's own stdin) is not accepted; pass input inline with stdin: %w", what, arg, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(arg, "~"):
		return "", fmt.Errorf("%s %q: \"~\" is not expanded; give an absolute path or one relative to %s: %w", what, arg, h.Root, errdefs.ErrInvalidArgument)
	case strings.ContainsRune(arg, 0):
		return "", fmt.Errorf("%s contains a NUL byte: %w", what, errdefs.ErrInvalidArgument)
	}
	if filepath.IsAbs(arg) {
		return arg, nil
	}
	return h.Root + string(filepath.Separator) + arg, nil
}

// allowed checks a resolved path against the state root and the confinement
// root. Refusals name the root and the variable that moves it.
func (h HostIO) allowed(what, arg, resolved string) error {
	if h.Home != "" && within(h.Home, resolved) {
		return fmt.Errorf("%s %q resolves to %s, inside the isopod state directory %s, which the MCP server never reads or writes: %w",
			what, arg, resolved, h.Home, errdefs.ErrInvalidArgument)
	}
	if !within(h.Root, resolved) {
		return fmt.Errorf("%s %q resolves to %s, outside the host-I/O root %s; use a path under %s (the root is the server's working directory unless %s moves it): %w",
			what, arg, resolved, h.Root, h.Root, knobs.MCPHostIORoot, errdefs.ErrInvalidArgument)
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

// resolveForWrite normalises abs and resolves it component by component. The
// existing prefix is resolved through symlinks (a dangling or looping link is
// refused); ".." steps up from a resolved directory; once a component does
// not exist the rest is appended as written, and a ".." there is refused
// because nothing on disk says where it leads.
func resolveForWrite(abs string) (string, error) {
	var parts []string
	for _, c := range strings.Split(abs, "/") {
		if c != "" && c != "." {
			parts = append(parts, c)
		}
	}
	cur := "/"
	missing := false
	for i, c := range parts {
		if c == ".." {
			if missing {
				return "", errors.New(`".." below a directory that does not exist`)
			}
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		if missing {
			cur = next
			continue
		}
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = true
			cur = next
			continue
		case err != nil:
			return "", err
		}
		last := i == len(parts)-1
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", fmt.Errorf("%s is a symlink that does not resolve (%v)", next, err)
			}
			next = target
			if fi, err = os.Stat(next); err != nil {
				return "", err
			}
		}
		if !last && !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory", next)
		}
		cur = next
	}
	return cur, nil
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

// kindOf names a file's type for a refusal message.
func kindOf(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a block device"
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "not a regular file"
}
