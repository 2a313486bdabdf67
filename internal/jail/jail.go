//go:build linux

// Package jail confines every VMM process isopod starts, before it executes
// a single instruction of the VMM:
//
//   - its own user, mount, pid, ipc, uts and network namespaces (it needs no
//     network: every channel it has arrives as an inherited descriptor);
//   - an empty, read-only root (pivot_root) that holds only what the VMM
//     reads: its binary, libraries and firmware, read-only, a few device
//     nodes, and its own /proc; everything else comes as descriptors;
//   - an unprivileged uid that is not the invoking user's own account (a
//     dedicated system user when isopod runs as root; a subordinate id from
//     /etc/subuid otherwise), no capabilities at all, no_new_privs;
//   - a cgroup with memory, pids and CPU caps, removed with the VMM (rlimits
//     where no cgroup can be had, with a warning);
//   - death with its parent (PR_SET_PDEATHSIG, set again right before the
//     VMM executes).
//
// The VMM adds its own seccomp filter (QEMU's -sandbox), which the driver
// asks for.
//
// It fails closed: if any piece cannot be set up, the VMM does not start,
// and the error names the missing piece and the fix. The only way to run
// unconfined is not to use a Jailer (ISOPOD_JAIL=off).
//
// The steps that must happen inside the new namespaces are done by a
// helper process (package jailchild) that sets the jail up and executes the
// VMM in its place. It is the small isopod-jail program when one is
// installed beside the running program, in its prefix's lib/isopod or in
// /usr/lib/isopod; otherwise
// the running binary is re-executed, and this package's init function
// takes over a process started that way. Any program that imports this
// package (the CLI, the MCP server, the tests) can therefore start jailed
// VMMs.
package jail

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"isopod/internal/errdefs"
	"isopod/internal/jail/jailchild"
	"isopod/internal/knobs"
)

// A process started by Command without a dedicated helper runs this
// package's init first: it becomes the jail helper and never returns to
// the program's main.
func init() {
	if _, ok := os.LookupEnv(jailchild.Env); ok {
		jailchild.Main()
	}
}

// SystemUser is the dedicated account jailed VMMs run as when isopod runs
// as root. scripts/install.sh and the packages create it.
const SystemUser = "isopod-vmm"

// Config configures a Jailer.
type Config struct {
	Logger *slog.Logger
	// ProcSys is where the kernel's tunables are read; default /proc/sys.
	// Tests point it elsewhere.
	ProcSys string
	// CgroupRoot is where cgroup hierarchies are mounted; default
	// /sys/fs/cgroup.
	CgroupRoot string
	// Scope tags the cgroups of one state root, so that housekeeping of
	// one never touches another's (several roots share the cgroup parent);
	// letters and digits, empty for none.
	Scope string
}

// Jailer confines VMM processes on this host. It is safe for concurrent
// use.
type Jailer struct {
	log      *slog.Logger
	ids      idPlan
	cgroups  cgroupPlan
	scope    string
	helper   string   // the dedicated helper program; "" to re-execute this one
	passed   []string // why helpers that exist were passed over
	warnings []string
}

// New checks that every piece of the jail can be had on this host and
// returns a Jailer, or an error that names what is missing and how to fix
// it (errdefs.ErrFailedPrecondition).
func New(cfg Config) (*Jailer, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ProcSys == "" {
		cfg.ProcSys = "/proc/sys"
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	for _, r := range cfg.Scope {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return nil, fmt.Errorf("jail: scope %q: letters and digits only: %w", cfg.Scope, errdefs.ErrInvalidArgument)
		}
	}
	j := &Jailer{log: cfg.Logger, scope: cfg.Scope}
	if err := checkUserNamespaces(cfg.ProcSys, os.Geteuid(), apparmorLabel()); err != nil {
		return nil, err
	}
	if err := userNamespaceRefused(probeUserNamespace()); err != nil {
		return nil, err
	}
	ids, warn, err := planIDs(os.Geteuid())
	if err != nil {
		return nil, err
	}
	j.ids = ids
	j.warnings = append(j.warnings, warn...)
	cg, warn := planCgroups(cfg.CgroupRoot, os.Geteuid())
	j.cgroups = cg
	j.warnings = append(j.warnings, warn...)
	self, _ := os.Executable()
	j.helper = findHelper(self, []string{packagedHelper}, os.Geteuid(), func(path string, err error) {
		j.passed = append(j.passed, fmt.Sprintf("%s: %v", path, err))
		cfg.Logger.Warn("jail helper passed over; VMMs start through a re-execution of this program", "path", path, "err", err)
	})
	cfg.Logger.Debug("jail ready", "uid", ids.uid, "gid", ids.gid, "cgroups", cg.kind, "helper", helperLabel(j.helper), "warnings", j.warnings)
	return j, nil
}

// Warnings are what every report of a jailed run should say about the
// jail on this host (a fallback that weakens it).
func (j *Jailer) Warnings() []string { return append([]string(nil), j.warnings...) }

// UID and GID are the host ids jailed VMMs run as.
func (j *Jailer) UID() int { return j.ids.uid }
func (j *Jailer) GID() int { return j.ids.gid }

// Groups are the host gids jailed VMMs keep as supplementary groups: the
// kvm group when isopod runs as root, the user's own groups when the VMM
// runs as the user, none for a subordinate id (unshare drops them).
func (j *Jailer) Groups() []int {
	switch {
	case os.Geteuid() == 0:
		return append([]int(nil), j.ids.groups...)
	case j.ids.mode == mapHelper:
		return nil
	}
	g, _ := os.Getgroups()
	return g
}

// SetupError says why the jail cannot be set up on this host: the missing
// piece and the fix. It is an errdefs.ErrFailedPrecondition.
type SetupError struct {
	What string // what is missing
	Fix  string // how to provide it
}

func (e *SetupError) Error() string {
	return fmt.Sprintf("the VMM jail cannot be set up: %s; %s (or set %s=off to run the VMM unconfined, for debugging only): %v",
		e.What, e.Fix, knobs.Jail, errdefs.ErrFailedPrecondition)
}

func (e *SetupError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// failed builds the SetupError that names the missing piece and the fix.
func failed(what, fix string) error { return &SetupError{What: what, Fix: fix} }

// checkUserNamespaces refuses a host that does not let this process create
// user namespaces, naming the setting that forbids it. label is the
// AppArmor label this process runs under (apparmorLabel).
func checkUserNamespaces(procSys string, euid int, label string) error {
	read := func(name string) (string, bool) {
		b, err := os.ReadFile(filepath.Join(procSys, name))
		if err != nil {
			return "", false
		}
		return strings.TrimSpace(string(b)), true
	}
	if v, ok := read("user/max_user_namespaces"); ok {
		if n, err := strconv.Atoi(v); err == nil && n == 0 {
			return failed("user namespaces are disabled (user.max_user_namespaces = 0)",
				"enable them with `sysctl -w user.max_user_namespaces=15000`")
		}
	} else if _, err := os.Stat("/proc/self/ns/user"); errors.Is(err, os.ErrNotExist) {
		return failed("this kernel has no user namespaces", "use a kernel built with CONFIG_USER_NS")
	}
	if euid == 0 {
		return nil
	}
	if v, ok := read("kernel/unprivileged_userns_clone"); ok && v == "0" {
		return failed("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
			"allow them with `sudo sysctl -w kernel.unprivileged_userns_clone=1`, or run isopod as root")
	}
	// Ubuntu 23.10 and later: an unconfined process may create a user
	// namespace but holds no capability in it, so the jail could not be
	// built. A process under a profile of its own (the one README.md
	// gives, which grants userns) is not restricted.
	if v, ok := read("kernel/apparmor_restrict_unprivileged_userns"); ok && v == "1" && (label == "" || label == "unconfined") {
		return failed("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1) and isopod runs without an AppArmor profile that allows them",
			"install the AppArmor profile for isopod that README.md gives (/etc/apparmor.d/isopod, with `userns,`), "+
				"or allow them for every program with `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or run isopod as root")
	}
	return nil
}

// probeUserNamespace creates a user namespace the way the jail will (a
// child cloned into one), so that what the settings checkUserNamespaces
// reads do not show (the limit of an enclosing namespace, a container's
// seccomp filter, a security module) refuses the run before anything
// starts. The child executes a path that does not exist and is reaped at
// once: ENOENT means the namespace was made.
func probeUserNamespace() error {
	_, err := syscall.ForkExec("/nonexistent/isopod-user-namespace-probe", []string{"isopod-userns-probe"},
		&syscall.ProcAttr{Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}})
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err == nil {
		return errors.New("the probe ran") // cannot happen
	}
	return err
}

// userNamespaceRefused says why the probe could not make a user namespace
// (nil: it could).
func userNamespaceRefused(err error) error {
	if err == nil {
		return nil
	}
	what := fmt.Sprintf("this process cannot create a user namespace (%v)", err)
	fix := "allow user namespaces where isopod runs"
	switch {
	case errors.Is(err, syscall.ENOSPC):
		what += ": the limit on user namespaces of this or an enclosing namespace is reached"
		fix = "raise user.max_user_namespaces in the namespace that sets it to its limit (`sysctl -w user.max_user_namespaces=15000` there)"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		what += ": a seccomp filter (a container runtime's), a security module or a sysctl forbids it"
		fix = "run isopod where user namespaces are allowed (outside that container, or in one whose seccomp profile and security module allow them)"
	case errors.Is(err, syscall.EINVAL):
		what += ": this kernel has no user namespaces"
		fix = "use a kernel built with CONFIG_USER_NS"
	}
	return failed(what, fix)
}

// apparmorLabel is the AppArmor label this process runs under:
// "unconfined", a profile's name and mode ("isopod (unconfined)"), or ""
// where AppArmor says nothing.
func apparmorLabel() string {
	for _, p := range []string{"/proc/self/attr/apparmor/current", "/proc/self/attr/current"} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(strings.TrimRight(string(b), "\x00\n"))
		}
	}
	return ""
}
