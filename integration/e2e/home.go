package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/config"
	"isopod/internal/knobs"
	"isopod/internal/paths"
)

// homePrefix names private state roots in the temporary directory.
const homePrefix = "isopod-test-home-"

// ownerFile, inside a private home, is locked for as long as the test
// binary that made the home runs; an unlocked one is a leftover.
const ownerFile = ".owner"

// shared are the parts of a state root a private home links to: what runs
// only read and what isopod replaces only by renaming a new file over the
// old one (kernels, images, warm-pool snapshots, the accelerator probe).
// VM records, stages and locks start empty.
var shared = []string{"kernels", "images", "snapshots", "accel-probe.json"}

// copied name the files isopod appends to in place (a snapshot's use
// count): the home gets a copy of each, never a link.
var copied = map[string]bool{"uses": true}

// skipPrefixes name the temporary and retired entries of fetches, builds
// and the warm pool: they belong to whoever is at work in the source.
var skipPrefixes = []string{".tmp-", ".download-", ".old-"}

// Home is a private state root for one test binary. It mirrors the
// directories of a source state root's kernels, images and snapshots and
// hard-links every file in them (a symbolic link where a hard link cannot
// be made), so a run boots the installed kernel and images without copying
// them, and everything a run writes (VM records, stages, locks, a rebuilt
// image or snapshot) lands in the private home only.
//
// The links are safe to share because isopod never writes an existing
// image, kernel or snapshot file other than the few it appends to, which
// are copied (see copied): it publishes a new one under a
// temporary name and renames it into place, which replaces the private
// link and leaves the source file alone, and it removes entries (sweeps,
// retired snapshots) by unlinking them, which removes only the link. What
// a test would break is a write into a linked file; Close reports one.
type Home struct {
	// Dir is the private state root.
	Dir string
	// Source is the state root it links to.
	Source string

	owner  *os.File
	linked []linkedFile
}

// linkedFile is a source file and what it was when linked.
type linkedFile struct {
	path string
	info fs.FileInfo
}

// NewHome makes a private state root in tmp (the system's temporary
// directory when empty) linked to source, which may be missing or empty.
// It first removes what test binaries killed before their Close left.
func NewHome(tmp, source string) (_ *Home, retErr error) {
	if tmp == "" {
		tmp = os.TempDir()
	}
	// isopod makes $ISOPOD_HOME absolute without resolving links, so a
	// resolved Dir is what QEMU's command lines will name.
	tmp, err := filepath.EvalSymlinks(tmp)
	if err != nil {
		return nil, fmt.Errorf("making a private state root: %w", err)
	}
	SweepHomes(tmp)
	dir, err := os.MkdirTemp(tmp, homePrefix)
	if err != nil {
		return nil, fmt.Errorf("making a private state root: %w", err)
	}
	h := &Home{Dir: dir, Source: source}
	defer func() {
		if retErr != nil {
			h.Close()
		}
	}()
	if h.owner, err = lockOwner(dir, true); err != nil {
		return nil, err
	}
	for _, name := range shared {
		if err := h.mirror(filepath.Join(source, name), filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("linking %s into a private state root: %w", name, err)
		}
	}
	return h, nil
}

// mirror recreates the tree at src under dst: directories are made,
// regular files linked, symbolic links copied as they are.
func (h *Home) mirror(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // not installed, or removed by a client of the source
		}
		if err != nil {
			return err
		}
		if p != src && hasSkipPrefix(d.Name()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o700)
		case d.Type().IsRegular() && copied[d.Name()]:
			return copyFile(p, to)
		case d.Type().IsRegular():
			info, err := d.Info()
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := os.Link(p, to); errors.Is(err, fs.ErrNotExist) {
				return nil
			} else if err != nil {
				// Another file system, or a file the kernel will not let
				// this user hard-link: a symbolic link is as safe for what
				// isopod does to it.
				if err := os.Symlink(p, to); err != nil {
					return err
				}
			}
			h.linked = append(h.linked, linkedFile{path: p, info: info})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		return nil
	})
}

// copyFile copies src to dst; a src removed meanwhile is skipped.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

func hasSkipPrefix(name string) bool {
	for _, p := range skipPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Close stops any QEMU still running on the home's files, checks that no
// source file was written through a link, and removes the home. It
// removes nothing while a file system is mounted below the home. It is
// safe to call more than once.
func (h *Home) Close() error {
	if h.Dir == "" {
		return nil
	}
	var errs []error
	if changed := h.changedSources(); len(changed) > 0 {
		errs = append(errs, fmt.Errorf("source files written through the private state root's links: %s", strings.Join(changed, ", ")))
	}
	if err := removeHome(h.Dir); err != nil {
		errs = append(errs, err)
	} else {
		h.Dir = ""
	}
	if h.owner != nil {
		h.owner.Close()
		h.owner = nil
	}
	return errors.Join(errs...)
}

// changedSources lists the linked source files whose size, mode or
// modification time changed. A source file replaced since (a rebuild in the
// source home) is another file and is not compared.
func (h *Home) changedSources() []string {
	var changed []string
	for _, l := range h.linked {
		now, err := os.Lstat(l.path)
		if err != nil || !os.SameFile(now, l.info) {
			continue
		}
		if now.Size() != l.info.Size() || now.Mode() != l.info.Mode() || !now.ModTime().Equal(l.info.ModTime()) {
			changed = append(changed, l.path)
		}
	}
	return changed
}

// removeHome kills the QEMU processes whose command line names files under
// dir and removes dir, unless something is mounted below it.
func removeHome(dir string) error {
	if err := stopVMMs(dir); err != nil {
		return err
	}
	if m := mountsUnder(dir); len(m) > 0 {
		return fmt.Errorf("keeping %s: mounted below it: %s", dir, strings.Join(m, ", "))
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the private state root: %w", err)
	}
	// Its runs' socket directory, empty once they ended.
	if p, err := paths.New(dir); err == nil {
		os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("isopod-%d", os.Getuid()), p.Scope()))
	}
	return nil
}

// stopVMMs kills every QEMU that uses a file under dir and waits for them
// to exit.
func stopVMMs(dir string) error {
	pids := VMMsOf(dir)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("QEMU %d on %s did not exit after SIGKILL", pid, dir)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// VMMsOf lists the QEMU processes of the VMs recorded under the state root
// dir: their command line names the VM (-name isopod-<id>); QEMU gets
// every file as a descriptor, so no path of dir appears in it.
func VMMsOf(dir string) []int {
	ents, _ := os.ReadDir(filepath.Join(dir, "vms"))
	var names [][]byte
	for _, e := range ents {
		names = append(names, []byte("\x00isopod-"+e.Name()+"\x00"))
	}
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("qemu-system")) {
			continue
		}
		for _, n := range names {
			if bytes.Contains(cmdline, n) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// lockOwner opens dir's owner file and locks it: blocking is false only to
// test whether the owner is gone. The lock lasts as long as the open file
// (it is not inherited by the processes the test starts).
func lockOwner(dir string, blocking bool) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if !blocking {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sweepAge is how old a private home must be before SweepHomes may take it
// for a leftover: far longer than a new home goes without its owner lock.
const sweepAge = time.Minute

// SweepHomes removes the private state roots in tmp whose test binary is
// gone (killed by a timeout before its Close): their owner file is
// unlocked or missing, and they are older than a minute.
func SweepHomes(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, homePrefix+"*"))
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || time.Since(fi.ModTime()) < sweepAge {
			continue
		}
		f, err := lockOwner(dir, false)
		if err != nil {
			continue // its test binary is still running
		}
		removeHome(dir)
		f.Close()
	}
}

// userStateRoot is the state root isopod itself would use here:
// $ISOPOD_HOME, else ~/.isopod.
func userStateRoot() (string, error) {
	s, err := config.Load(func(k string) (string, bool) {
		if k == knobs.Home {
			return os.LookupEnv(k)
		}
		return "", false
	})
	if err != nil {
		return "", err
	}
	return s.Paths.Home, nil
}

// testMaxVMs is the VM places of a test binary's private home.
const testMaxVMs = 16

// PrivateHome runs m with $ISOPOD_HOME, for the test process and every
// process it starts, set to a private [Home] linked to the user's state
// root, and returns the exit code. A test package that runs isopod, in
// process or as a binary, calls it from TestMain so that `go test` never
// writes to the user's own store. Removing the home or finding a source
// file changed fails the test binary.
func PrivateHome(m *testing.M) int { return privateHome(m, nil) }

// privateHome is PrivateHome with prep run in the home before the tests.
func privateHome(m *testing.M, prep func() error) int {
	src, err := userStateRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	h, err := NewHome("", src)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	HomeDir, SourceHome = h.Dir, h.Source
	os.Setenv(knobs.Home, h.Dir)
	// A package's tests run their VMs side by side, more of them than the
	// host's default VM places (one per core under TCG); the tests of the
	// places themselves set their own limit.
	if _, ok := os.LookupEnv(knobs.MaxVMs); !ok {
		os.Setenv(knobs.MaxVMs, strconv.Itoa(testMaxVMs))
	}
	code := 1
	if prep != nil {
		if err := prep(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			h.Close()
			return code
		}
	}
	code = m.Run()
	if err := h.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
