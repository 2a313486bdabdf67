//go:build linux

// Package workspace carries a host directory into a sandbox and brings the
// sandbox's changes back as a patch.
//
// [Pack] takes a point-in-time copy of a tree into a private staging
// directory and packs it into an uncompressed squashfs image, which the core
// attaches to the VM read-only (the guest puts a writable overlay on top).
// In a git work tree the copy holds what git would see (tracked files, and
// untracked files that are not ignored) and the repository's .git, less the
// credentials its config may hold; elsewhere, or with [Options.All], it
// holds everything. A repository config's includes are inlined (those
// naming files in its git directory) or dropped (the others), and the
// included files and credential stores left out: see gitinclude.go.
//
// The tree is read through directory descriptors, one component at a time,
// and no symlink is ever followed: a link is copied as a link (one that
// points outside the tree dangles in the guest), and a directory swapped for
// a link during the copy is not entered. Git's file list only chooses names.
// Sockets, FIFOs and devices are skipped and counted. A sparse file keeps
// its holes.
//
// After the run, [Tree.Patch] turns what the guest reports changed
// ([Change]) into a git patch against the staging copy, which `git apply`
// accepts on the original tree. Everything a guest sends is untrusted: paths
// are checked before anything is written, and the patch is capped.
//
// Both ends use the host's tools: git (the file list, the credential scrub,
// the patch) and mksquashfs (squashfs-tools).
package workspace

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"isopod/internal/errdefs"
)

// Caps. The CLI's defaults can be raised by its flags; the MCP server's are
// fixed.
const (
	// DefaultMaxBytes caps the regular files of a copy (.git included).
	DefaultMaxBytes int64 = 2 << 30
	// DefaultMaxFiles caps the entries of a copy: files, directories, links.
	DefaultMaxFiles = 200_000
	// DefaultMaxPatchBytes caps a patch, and the new content it may carry.
	DefaultMaxPatchBytes int64 = 64 << 20

	// MCPMaxBytes, MCPMaxFiles and MCPMaxPatchBytes are the MCP server's
	// caps.
	MCPMaxBytes      int64 = 512 << 20
	MCPMaxFiles            = 100_000
	MCPMaxPatchBytes int64 = 16 << 20
)

// Kinds of entry a copy skips, the keys of [Tree.Skipped].
const (
	SkippedSocket     = "socket"
	SkippedFIFO       = "fifo"
	SkippedDevice     = "device"
	SkippedUnreadable = "unreadable" // permission denied
	// SkippedGitLock counts git's lock files (index.lock, ...) in .git: a
	// git command was running on the host, and a copied lock would lock
	// the guest's repository.
	SkippedGitLock = "git lock"
)

// Options limit and shape a copy. The zero value takes what git would see,
// under the default caps.
type Options struct {
	// All takes everything under the directory, not what git would see.
	All bool
	// MaxBytes caps the total size of the regular files copied; 0 means
	// DefaultMaxBytes.
	MaxBytes int64
	// MaxFiles caps the entries copied (files, directories, symlinks); 0
	// means DefaultMaxFiles.
	MaxFiles int
	// MaxPatchBytes caps a patch made from the tree, and the bytes of new
	// content it may carry; 0 means DefaultMaxPatchBytes.
	MaxPatchBytes int64
}

// Validate refuses negative caps.
func (o Options) Validate() error {
	if o.MaxBytes < 0 || o.MaxFiles < 0 || o.MaxPatchBytes < 0 {
		return fmt.Errorf("workspace caps must not be negative (bytes %d, files %d, patch bytes %d); 0 means the default: %w",
			o.MaxBytes, o.MaxFiles, o.MaxPatchBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxFiles == 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.MaxPatchBytes == 0 {
		o.MaxPatchBytes = DefaultMaxPatchBytes
	}
	return o
}

// Tree is a packed copy of a directory. Its methods are safe for concurrent
// use; Patch and Close are serialised.
type Tree struct {
	// Image is the squashfs image to attach, read-only. Files in it are
	// owned by root; modes are kept less setuid, setgid and sticky, and so
	// are modification times.
	Image string
	// Files counts the entries copied (files, directories, symlinks) and
	// Bytes the size of the regular files among them.
	Files, Bytes int64
	// Skipped counts what was left out by kind (SkippedFIFO, ...).
	Skipped map[string]int
	// CredentialsRemoved names what was removed from the copy's git
	// configuration: key names, never values ("credential.helper",
	// "remote.origin.url (user info)"), include lines ("include.path
	// (inlined: .git/team.inc)", "include.path (outside the git
	// directory, dropped)"), and files left out (".git/team.inc
	// (included, left out)", ".git/credentials (a credential store, left
	// out)"). A setting of a file other than .git/config is named after
	// it (".git/modules/lib/config: ...", ".git/team.inc: ...").
	CredentialsRemoved []string
	// Git says the copy followed git's rules (tracked and untracked,
	// not-ignored files, and .git when the directory is the top level).
	Git bool
	// Prefix is the directory's path below the top level of its repository,
	// with a trailing slash ("" at the top, or outside git). The names in a
	// patch carry it, so that `git apply` run anywhere in the repository
	// finds them.
	Prefix string
	// CopyTime is what choosing (git), copying and removing credentials
	// took; PackTime what mksquashfs took.
	CopyTime, PackTime time.Duration

	maxPatch     int64
	objectFormat string // the repository's object format, for the patch's ids
	// src is the directory copied, held in git mode to ask its
	// repository, when a patch is made, which added files it ignores.
	src *os.File

	mu sync.Mutex // guards following
	// dir is the private directory holding the staging copy (dir/tree)
	// and the image; "" once closed.
	dir string
}

// stage is the staging copy's root.
//
// Preconditions: t.mu is held and t.dir is set.
func (t *Tree) stage() string { return filepath.Join(t.dir, "tree") }

// Close removes the staging copy and the image. It is idempotent.
func (t *Tree) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dir == "" {
		return nil
	}
	if t.src != nil {
		t.src.Close()
		t.src = nil
	}
	err := removeTree(t.dir)
	t.dir = ""
	return err
}

// removeTree removes a directory that may hold read-only directories: each
// is made writable before its entries are removed.
func removeTree(dir string) error {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing workspace copy: %w", err)
	}
	return nil
}

// LimitError is a refusal for size: a tree over a cap of [Options], or a
// patch over its cap. It wraps errdefs.ErrInvalidArgument. The message
// says how to narrow the tree; a front end may add the setting that raises
// the cap ("or raise --workspace-max-files").
type LimitError struct {
	// What is capped: "entries", "bytes", "patch bytes" or "changed bytes".
	What string
	// Have is how many there are; when AtLeast, counting stopped there.
	Have    int64
	AtLeast bool
	Limit   int64
	// InGit is how many of the bytes lie in .git (What == "bytes").
	InGit int64
}

func (e *LimitError) Error() string {
	have := fmt.Sprint(e.Have)
	if e.AtLeast {
		have = "more than " + have
	}
	switch e.What {
	case "entries":
		return fmt.Sprintf("workspace holds %s entries (files, directories, links), over the limit of %d; narrow it (.gitignore, a subdirectory)", have, e.Limit)
	case "bytes":
		git := ""
		if e.InGit > 0 {
			git = fmt.Sprintf(", %s of it in .git", human(e.InGit))
		}
		return fmt.Sprintf("workspace holds %s bytes (%s%s), over the limit of %d (%s); narrow it (.gitignore, a subdirectory)",
			have, human(e.Have), git, e.Limit, human(e.Limit))
	case "changed bytes":
		return fmt.Sprintf("the run changed files holding %s bytes (%s), over the patch limit of %d (%s); copy large outputs out instead",
			have, human(e.Have), e.Limit, human(e.Limit))
	}
	return fmt.Sprintf("the patch is %s bytes (%s), over the limit of %d (%s); copy large outputs out instead",
		have, human(e.Have), e.Limit, human(e.Limit))
}

func (e *LimitError) Unwrap() error { return errdefs.ErrInvalidArgument }

// human writes a size in binary units, for messages.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
