package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/hosttool"
)

// writePseudo writes a mksquashfs pseudo file that gives every entry of
// the root (but the root itself, which takes -root-* options) the mode
// and owner the image says, and returns how many entries it names. The
// files on the host all belong to the unpacking user with masked modes;
// this file is what makes the squashfs say otherwise. (Times are set on
// the host files instead, by setTimes: mksquashfs 4.5 refuses a timed
// definition for a directory that has definitions below it.)
func (u *unpacker) writePseudo(file string) (int, error) {
	f, err := os.Create(file)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	n := 0
	var walk func(dir *unode, prefix string)
	walk = func(dir *unode, prefix string) {
		names := make([]string, 0, len(dir.children))
		for name := range dir.children {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			c := dir.children[name]
			p := path.Join(prefix, name)
			mode := c.meta.mode
			if c.kind == kindSym {
				mode = 0o777
			}
			// A directory's own line comes after its entries': mksquashfs
			// cannot add entries below a name it was told to modify.
			if c.kind == kindDir {
				walk(c, p)
			}
			fmt.Fprintf(w, "%s m %o %d %d\n", pseudoQuote(p), mode, c.meta.uid, c.meta.gid)
			n++
		}
	}
	walk(u.root, "")
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	return n, f.Close()
}

// setTimes gives every host file the modification time the image says,
// directories after what they hold.
func (u *unpacker) setTimes() error {
	var walk func(dir *unode, prefix []string) error
	walk = func(dir *unode, prefix []string) error {
		for name, c := range dir.children {
			p := append(prefix[:len(prefix):len(prefix)], name)
			if c.kind == kindDir {
				if err := walk(c, p); err != nil {
					return err
				}
			}
			if err := u.setTime(u.hostPath(p), c.meta.mtime); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(u.root, nil); err != nil {
		return fmt.Errorf("setting file times: %w", err)
	}
	return nil
}

func (u *unpacker) setTime(p string, mtime uint32) error {
	ts := []unix.Timespec{{Sec: int64(mtime)}, {Sec: int64(mtime)}}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// pseudoQuote quotes a path for a pseudo file: in double quotes, with '"'
// and '\' escaped. (Paths never hold control characters: see cleanName.)
func pseudoQuote(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(p) + `"`
}

// packImported packs the unpacked root into out with the metadata the
// tree holds.
func (u *unpacker) pack(ctx context.Context, pseudo, out string) error {
	if _, err := u.writePseudo(pseudo); err != nil {
		return fmt.Errorf("writing the pseudo file: %w", err)
	}
	if err := u.setTimes(); err != nil {
		return err
	}
	bin, err := hosttool.Find("mksquashfs")
	if err != nil {
		return err
	}
	r := u.root.meta
	args := []string{u.dir, out,
		"-noappend", "-mkfs-time", "0", "-comp", "zstd", "-Xcompression-level", "6", "-b", "131072",
		"-no-xattrs", "-no-exports", "-reproducible", "-quiet", "-no-progress",
		"-pf", pseudo,
		"-root-mode", strconv.FormatUint(uint64(r.mode&0o7777), 8),
		"-root-uid", strconv.FormatUint(uint64(r.uid), 10), "-root-gid", strconv.FormatUint(uint64(r.gid), 10),
		"-root-time", strconv.FormatUint(uint64(r.mtime), 10),
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var o bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &o
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mksquashfs: %w: %s", err, strings.TrimSpace(o.String()))
	}
	// mksquashfs ignores (with a message) a pseudo definition it cannot
	// apply: such a base would carry the unpacking user's owner and modes.
	if bytes.Contains(o.Bytes(), []byte("Ignoring")) || bytes.Contains(o.Bytes(), []byte("does not exist")) {
		return fmt.Errorf("mksquashfs did not apply every mode and owner: %s", strings.TrimSpace(o.String()))
	}
	return nil
}
