//go:build linux

package jail

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/hosttool"
	"isopod/internal/jail/jailchild"
)

// Spec is one VMM process to confine.
type Spec struct {
	// Name names its cgroup (unique among running VMMs, e.g. the VM id).
	Name string
	// Path is the VMM binary and Args its arguments (without argv[0]).
	Path string
	Args []string
	// ExtraFiles become descriptors 3, 4, ... of the VMM, as with exec.Cmd.
	ExtraFiles []*os.File
	Stdout     io.Writer
	Stderr     io.Writer
	// ReadOnly are host paths (files or directories) the VMM reads; each
	// is visible read-only at the same path inside. Symlinks in them are
	// resolved on the host.
	ReadOnly []string
	// Devices are device nodes the VMM opens read-write (/dev/null is
	// always there). Each must open inside the jail, or the VMM does not
	// start.
	Devices []string
	Limits  Limits
}

// defaultDevices are in every jail.
var defaultDevices = []string{"/dev/null", "/dev/zero", "/dev/urandom"}

// binds resolves s's paths on the host.
func (s Spec) binds() ([]jailchild.Bind, error) {
	var out []jailchild.Bind
	seen := map[string]bool{}
	add := func(p string, dev bool) error {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("jail: %q is not an absolute path", p)
		}
		at := filepath.Clean(p)
		if seen[at] {
			return nil
		}
		seen[at] = true
		src, err := filepath.EvalSymlinks(at)
		if err != nil {
			return failed(fmt.Sprintf("%s, which the VMM needs, cannot be found (%v)", at, err), "install it or fix the path")
		}
		out = append(out, jailchild.Bind{Src: src, At: at, Dev: dev})
		return nil
	}
	for _, p := range append([]string{s.Path}, s.ReadOnly...) {
		if err := add(p, false); err != nil {
			return nil, err
		}
	}
	for _, d := range append(append([]string(nil), defaultDevices...), s.Devices...) {
		if err := add(d, true); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Process is a confined VMM being started. Start it with Cmd.Start from a
// thread that lives as long as it does (its parent-death signal follows
// that thread), then call Started.
type Process struct {
	Cmd *exec.Cmd
	// Pid is the VMM's host pid, known once Started returned: Cmd's own
	// process, or its child when a helper program made the namespaces.
	Pid int

	j      *Jailer
	cg     *vmCgroup
	sync   *os.File // the parent's end of the sync socket
	statR  *os.File
	statW  *os.File   // handed to the helper by Started
	closer []*os.File // the child's ends, closed once it started
}

// Command prepares spec's VMM to run confined. On error nothing is left
// behind; after Cmd.Start the caller must call Started, and Cleanup once
// the process has exited.
func (j *Jailer) Command(s Spec) (*Process, error) {
	binds, err := s.binds()
	if err != nil {
		return nil, err
	}
	p := &Process{j: j}
	ok := false
	defer func() {
		if !ok {
			p.Cleanup()
		}
	}()
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	p.sync = os.NewFile(uintptr(pair[0]), "jail-sync")
	syncChild := os.NewFile(uintptr(pair[1]), "jail-sync-child")
	p.closer = []*os.File{syncChild}
	if p.statR, p.statW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	if p.cg, err = j.cgroups.create(s.Name, s.Limits, j.ids.uid, j.ids.gid); err != nil {
		return nil, err
	}
	extra := append(append([]*os.File(nil), s.ExtraFiles...), syncChild)
	cs := jailchild.Spec{
		Path: s.Path, Argv: append([]string{s.Path}, s.Args...), Binds: binds,
		SyncFD: 3 + len(s.ExtraFiles),
	}
	if p.cg == nil {
		cs.Rlimits = rlimitsFor(s.Limits)
	} else {
		cs.Tasks = p.cg.tasks
	}
	// The helper (isopod-jail, or this binary) is executed through a
	// descriptor: the jail's uid may not reach the directories above it.
	exe, err := j.openHelper()
	if err != nil {
		return nil, err
	}
	p.closer = append(p.closer, exe)
	extra = append(extra, exe)
	cs.ExeFD = 2 + len(extra)
	helper := fmt.Sprintf("/proc/self/fd/%d", cs.ExeFD)
	var cmd *exec.Cmd
	if j.ids.mode == mapHelper {
		if cmd, err = j.helperCommand(helper, p); err != nil {
			return nil, err
		}
	} else {
		cmd = exec.Command(helper)
		cmd.Args = []string{"isopod-jail"}
		cmd.SysProcAttr = j.sysProcAttr(p.cg)
	}
	enc, err := jailchild.Encode(cs)
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	cmd.Env = []string{jailchild.Env + "=" + enc}
	if j.ids.mode == mapHelper {
		// unshare runs newuidmap and newgidmap by name: where they were
		// found (the helper and the VMM ignore PATH).
		var dirs []string
		for _, m := range j.ids.mappers {
			dirs = append(dirs, filepath.Dir(m))
		}
		cmd.Env = append(cmd.Env, "PATH="+strings.Join(dirs, ":"))
	}
	cmd.ExtraFiles = extra
	cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
	p.Cmd = cmd
	ok = true
	return p, nil
}

// helperCommand starts the jail helper through util-linux unshare, which
// maps a subordinate id with newuidmap and newgidmap before it runs the
// helper as uid 0 of the new namespace (the Go runtime cannot wait for
// those tools between clone and exec). The helper binary is handed over as
// a descriptor, so the subordinate id needs no access to the directories
// above it.
func (j *Jailer) helperCommand(helper string, p *Process) (*exec.Cmd, error) {
	unshare, err := hosttool.Find("unshare")
	if err != nil {
		return nil, failed(fmt.Sprintf("util-linux unshare, which maps a subordinate id, cannot be found (%v)", err), hosttool.Install("unshare"))
	}
	cmd := exec.Command(unshare,
		"--user", fmt.Sprintf("--map-users=%d,0,1", j.ids.uid), fmt.Sprintf("--map-groups=%d,0,1", j.ids.gid),
		"--setuid=0", "--setgid=0",
		"--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--ipc", "--uts", "--net",
		"--", helper)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.cg != nil && p.cg.fd != nil {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(p.cg.fd.Fd())
	}
	return cmd, nil
}

// sysProcAttr creates the namespaces and maps the ids (directly, or later
// through newuidmap), and places the child in its v2 cgroup as it is
// created.
func (j *Jailer) sysProcAttr(cg *vmCgroup) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET,
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	if j.ids.mode == mapDirect {
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: j.ids.uid, Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: j.ids.gid, Size: 1}}
		if os.Geteuid() == 0 {
			// Root drops its own supplementary groups for the VMM's: none,
			// or the kvm group (mapped inside as gid 1).
			a.GidMappingsEnableSetgroups = true
			cred := &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
			for i, g := range j.ids.groups {
				a.GidMappings = append(a.GidMappings, syscall.SysProcIDMap{ContainerID: i + 1, HostID: g, Size: 1})
				cred.Groups = append(cred.Groups, uint32(i+1))
			}
			a.Credential = cred
		}
	}
	if cg != nil && cg.fd != nil {
		a.UseCgroupFD, a.CgroupFD = true, int(cg.fd.Fd())
	}
	return a
}

// Started finishes the confinement of a started process: its ids are
// mapped; it sets up its root and drops its privileges while it is placed
// in its cgroup, and executes the VMM only once it is. Started returns
// once it executed the VMM, or with why it could not (the caller kills
// it).
func (p *Process) Started() error {
	for _, f := range p.closer {
		f.Close()
	}
	p.closer = nil
	// With subordinate ids, unshare has mapped them itself (newuidmap
	// writes a namespace's map once; a second write fails) before it runs
	// the helper.
	if err := syscall.Sendmsg(int(p.sync.Fd()), []byte{1}, syscall.UnixRights(int(p.statW.Fd())), nil, 0); err != nil {
		return fmt.Errorf("jail: releasing the VMM: %w", err)
	}
	// A v1 cgroup is joined by writing the pid (a v2 one at the clone),
	// which takes milliseconds: the helper builds the jail meanwhile, and
	// waits for the byte below before it executes the VMM.
	if err := p.cg.attach(p.Cmd.Process.Pid); err != nil {
		return err
	}
	// A helper that refused its spec is gone already: what it wrote on the
	// status pipe says why.
	p.sync.Write([]byte{1})
	// From here the helper holds the only write end: the read below ends
	// at its exec, or when it (or unshare, whose socket end dropped the
	// message) exits.
	p.statW.Close()
	p.statW = nil
	p.sync.Close()
	p.sync = nil
	msg, _ := io.ReadAll(io.LimitReader(p.statR, 4096))
	p.statR.Close()
	p.statR = nil
	// "pid N" comes first; anything after it is why the helper failed.
	first, rest, _ := strings.Cut(string(msg), "\n")
	if n, err := strconv.Atoi(strings.TrimPrefix(first, "pid ")); err == nil && strings.HasPrefix(first, "pid ") {
		p.Pid = n
	} else {
		rest = string(msg)
	}
	if rest = strings.TrimSpace(rest); rest != "" {
		return failed(rest, "see the message; the VMM did not start")
	}
	if p.Pid == 0 {
		return failed("the jail helper ended before it started the VMM", "see the VMM's output")
	}
	return nil
}

// Cleanup removes what the confinement made (its cgroup) once the process
// has exited. Idempotent.
func (p *Process) Cleanup() {
	for _, f := range append(p.closer, p.sync, p.statR, p.statW) {
		if f != nil {
			f.Close()
		}
	}
	p.closer, p.sync, p.statR, p.statW = nil, nil, nil, nil
	p.cg.remove()
}

// rlimitsFor caps a VMM without a cgroup: its address space (guest RAM,
// the emulator's translation cache and its own overhead), its processes
// and threads, its open files, and no core dumps. The process count is
// the VMM's own: the kernel counts it per user of a user namespace, and
// each VMM has a namespace of its own.
func rlimitsFor(l Limits) []jailchild.Rlimit {
	out := []jailchild.Rlimit{
		{Resource: syscall.RLIMIT_CORE, Max: 0},
		{Resource: syscall.RLIMIT_NOFILE, Max: 4096},
	}
	if l.MemoryBytes > 0 {
		out = append(out, jailchild.Rlimit{Resource: syscall.RLIMIT_AS, Max: uint64(l.MemoryBytes) + addressSpaceSlack})
	}
	if l.Pids > 0 {
		out = append(out, jailchild.Rlimit{Resource: unix.RLIMIT_NPROC, Max: uint64(l.Pids)})
	}
	return out
}

// addressSpaceSlack is what a VMM maps beyond its memory cap without using
// it (reserved translation cache, thread stacks, libraries).
const addressSpaceSlack = 3 << 30

// Libraries lists what a dynamically linked program needs to start: the
// shared libraries ldd names (the loader included) and the loader's cache.
func Libraries(bin string) ([]string, error) {
	ldd, err := hosttool.Find("ldd")
	if err != nil {
		return nil, fmt.Errorf("listing %s's libraries: %w", bin, err)
	}
	out, err := exec.Command(ldd, bin).Output()
	if err != nil {
		return nil, fmt.Errorf("listing %s's libraries with ldd: %w", bin, err)
	}
	var files []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		files = append(files, "/etc/ld.so.cache")
	}
	return files, nil
}
