package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"isopod/internal/hosttool"
)

// Layers are read on the host with e2fsprogs' debugfs, without mounting.
// Each invocation runs a batch of commands from a command file (-f) and
// addresses inodes by number ("<12>"), so no file name is ever quoted into
// a command. With -f, debugfs echoes "debugfs: <command>" before each
// command's output, which splits the output into per-command sections.

// findDebugfs locates the debugfs binary.
func findDebugfs() (string, error) {
	p, err := hosttool.Find("debugfs")
	if err != nil {
		return "", fmt.Errorf("reading stage layers: %w", err)
	}
	return p, nil
}

// debugfsRun runs cmds against image (read-only, without reading bitmaps)
// in working directory dir and returns one output section per command.
func debugfsRun(ctx context.Context, bin, image, dir string, cmds []string) ([][]byte, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	cf, err := os.CreateTemp("", "isopod-debugfs-*.cmd")
	if err != nil {
		return nil, fmt.Errorf("writing debugfs commands: %w", err)
	}
	defer os.Remove(cf.Name())
	_, werr := cf.WriteString(strings.Join(cmds, "\n") + "\n")
	if err := errors.Join(werr, cf.Close()); err != nil {
		return nil, fmt.Errorf("writing debugfs commands: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-c", "-f", cf.Name(), image)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBUGFS_PAGER=__none__", "PAGER=__none__")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("debugfs on %s: %w: %s", image, err, tail(stderr.String()))
	}
	out := stdout.Bytes()
	secs := make([][]byte, len(cmds))
	pos := 0
	for i, c := range cmds {
		marker := []byte("debugfs: " + c + "\n")
		at := bytes.Index(out[pos:], marker)
		if at < 0 {
			return nil, fmt.Errorf("debugfs on %s: no output for %q: %s", image, c, tail(stderr.String()))
		}
		start := pos + at + len(marker)
		end := len(out)
		if i+1 < len(cmds) {
			next := []byte("debugfs: " + cmds[i+1] + "\n")
			if n := bytes.Index(out[start:], next); n >= 0 {
				end = start + n
			}
		}
		secs[i] = out[start:end]
		pos = end
	}
	return secs, nil
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 500 {
		s = "..." + s[len(s)-500:]
	}
	return s
}

// dirent is one entry of a `ls -l -p` listing.
type dirent struct {
	ino  uint32
	mode uint32 // st_mode: type and permission bits
	uid  uint32
	gid  uint32
	name string
	size int64
}

// parseLsP parses the output of `ls -l -p`: records of the form
// "/ino/mode(octal)/uid/gid/name/size/" (size empty for directories), one
// per line. Names cannot contain '/', but may contain newlines, so the
// parser walks fields, not lines.
func parseLsP(sec []byte) ([]dirent, error) {
	var out []dirent
	i := 0
	field := func() (string, error) {
		j := bytes.IndexByte(sec[i:], '/')
		if j < 0 {
			return "", fmt.Errorf("truncated listing record at byte %d", i)
		}
		f := string(sec[i : i+j])
		i += j + 1
		return f, nil
	}
	num := func(base int) (uint64, error) {
		f, err := field()
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(f, base, 32)
	}
	for i < len(sec) {
		if sec[i] == '\n' {
			i++
			continue
		}
		if sec[i] != '/' {
			return nil, fmt.Errorf("unexpected listing text %q", tail(string(sec[i:min(i+80, len(sec))])))
		}
		i++
		var d dirent
		ino, err := num(10)
		if err != nil {
			return nil, err
		}
		mode, err := num(8)
		if err != nil {
			return nil, err
		}
		uid, err := num(10)
		if err != nil {
			return nil, err
		}
		gid, err := num(10)
		if err != nil {
			return nil, err
		}
		d.ino, d.mode, d.uid, d.gid = uint32(ino), uint32(mode), uint32(uid), uint32(gid)
		if d.name, err = field(); err != nil {
			return nil, err
		}
		sz, err := field()
		if err != nil {
			return nil, err
		}
		if sz != "" {
			if d.size, err = strconv.ParseInt(sz, 10, 64); err != nil {
				return nil, fmt.Errorf("listing size of %q: %w", d.name, err)
			}
		}
		if d.name != "." && d.name != ".." {
			out = append(out, d)
		}
	}
	return out, nil
}

var (
	opaqueRe = regexp.MustCompile(`(?m)^\s*trusted\.overlay\.opaque \(1\) = "y"\s*$`)
	devRe    = regexp.MustCompile(`Device major/minor number: (\d+):(\d+) \(hex`)
)

const fastLinkTag = `Fast link dest: "`

// parseDevice returns "major:minor" from a `stat` section, or "".
func parseDevice(sec []byte) string {
	m := devRe.FindSubmatch(sec)
	if m == nil {
		return ""
	}
	major, err1 := strconv.ParseUint(string(m[1]), 10, 32)
	minor, err2 := strconv.ParseUint(string(m[2]), 10, 32)
	if err1 != nil || err2 != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", major, minor)
}

// parseFastLink returns the target of a fast symlink of the given length
// from a `stat` section; ok is false for a symlink stored in a data block.
func parseFastLink(sec []byte, size int64) (string, bool) {
	i := bytes.Index(sec, []byte(fastLinkTag))
	if i < 0 {
		return "", false
	}
	i += len(fastLinkTag)
	if int64(len(sec)-i) < size {
		return "", false
	}
	return string(sec[i : i+int(size)]), true
}

// dumpName is the file a batch dump of inode ino writes.
func dumpName(dir string, ino uint32) string {
	return filepath.Join(dir, "i"+strconv.FormatUint(uint64(ino), 10))
}
