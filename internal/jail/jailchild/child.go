//go:build linux

package jailchild

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Main is the helper: it waits for the parent, builds the jail from the
// spec in Env and executes the VMM in its own place. It never returns:
// when anything fails it exits 125, with the reason written where the
// parent reads it (the status pipe, or stderr before it has one).
func Main() {
	runtime.LockOSThread() // credentials and the parent-death signal are per thread
	v, ok := os.LookupEnv(Env)
	if !ok {
		fmt.Fprintf(os.Stderr, "isopod-jail: no spec in the environment: isopod starts this program to confine each VMM; it is not run by hand\n")
		os.Exit(125)
	}
	var status *os.File
	err := run(v, &status)
	// Only a failure returns: say why, where the parent reads it.
	if status == nil {
		fmt.Fprintf(os.Stderr, "isopod-jail: %v\n", err)
	} else {
		fmt.Fprintf(status, "%v", err)
	}
	os.Exit(125)
}

// run receives the status pipe, then reads the spec (so that even a
// refused spec is reported to the parent) and runs the jail.
func run(v string, statusOut **os.File) error {
	fd := syncFD(v)
	if fd < 0 {
		_, err := Decode(v, self())
		if err == nil {
			err = fmt.Errorf("the spec has no sync descriptor")
		}
		return err
	}
	status, err := receiveStatus(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	*statusOut = status
	cs, err := Decode(v, self())
	if err != nil {
		return err
	}
	return runChild(cs, status, fd)
}

// receiveStatus waits for the parent's go-ahead on the sync socket and
// returns the status pipe that comes with it (close-on-exec). The socket
// stays open for waitPlaced.
func receiveStatus(fd int) (*os.File, error) {
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	for err == unix.EINTR {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return nil, fmt.Errorf("waiting for the parent: %w", err)
	}
	if n != 1 {
		return nil, fmt.Errorf("waiting for the parent: it went away")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("waiting for the parent: no status descriptor (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("waiting for the parent: no status descriptor (%v)", err)
	}
	return os.NewFile(uintptr(fds[0]), "status"), nil
}

// waitPlaced waits on the sync socket for the parent to say it placed
// this process in its cgroups (a byte 1), which it does while the jail is
// built; it closes the socket.
func waitPlaced(fd int) error {
	defer unix.Close(fd)
	buf := make([]byte, 1)
	n, err := unix.Read(fd, buf)
	for err == unix.EINTR {
		n, err = unix.Read(fd, buf)
	}
	if err != nil || n != 1 || buf[0] != 1 {
		return fmt.Errorf("the parent did not place the VMM in its cgroup (%d bytes, %v)", n, err)
	}
	return nil
}

// runChild builds the jail and executes the VMM once the parent placed it
// in its cgroups; status is the pipe the parent reads and syncFD the
// socket it says so on.
func runChild(cs *Spec, status *os.File, syncFD int) error {
	if cs.ExeFD > 2 {
		unix.Close(cs.ExeFD)
	}
	for _, t := range cs.Tasks {
		if err := os.WriteFile(t, []byte("0"), 0); err != nil {
			return fmt.Errorf("joining the VMM's cgroup (%s): %w", t, err)
		}
	}
	// The host pid of what will be the VMM: /proc here is still the
	// host's.
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return fmt.Errorf("reading its own pid: %w", err)
	}
	fmt.Fprintf(status, "pid %s\n", self)
	if err := buildRoot(cs.Binds); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte("isopod-vmm")); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	for _, r := range cs.Rlimits {
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Max, Max: r.Max}); err != nil {
			return fmt.Errorf("setting rlimit %d: %w", r.Resource, err)
		}
	}
	if err := checkDevices(cs.Binds); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(status.Fd(), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("status descriptor: %w", err)
	}
	if err := dropPrivileges(); err != nil {
		return err
	}
	// The parent-death signal is cleared by credential changes: set it
	// again, last.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("setting the parent-death signal: %w", err)
	}
	// Nothing of the VMM runs before its limits hold.
	if err := waitPlaced(syncFD); err != nil {
		return err
	}
	err = syscall.Exec(cs.Path, cs.Argv, []string{})
	return fmt.Errorf("executing %s: %w", cs.Path, err)
}

// checkDevices opens every device node read-write as the VMM will, so that
// a missing permission (the kvm group) stops the start with its reason.
func checkDevices(binds []Bind) error {
	for _, b := range binds {
		if !b.Dev {
			continue
		}
		f, err := os.OpenFile(b.At, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("the VMM cannot open %s inside its jail (%v): its uid needs the device's group (for /dev/kvm, the kvm group)", b.At, err)
		}
		f.Close()
	}
	return nil
}

// capLastCap is the highest capability number this kernel knows.
func capLastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 63
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 63
	}
	return n
}

// dropPrivileges leaves the calling thread (which then executes the VMM)
// with no capabilities it can ever regain: securebits that end root's
// special treatment, an empty bounding set, no ambient, inheritable,
// permitted or effective capabilities, and no_new_privs.
func dropPrivileges() error {
	const (
		secbitNoRoot            = 1 << 0
		secbitNoRootLocked      = 1 << 1
		secbitNoSetuidFixup     = 1 << 2
		secbitNoSetuidFixupLock = 1 << 3
		secbitKeepCapsLocked    = 1 << 5
		secbitNoCapAmbientRaise = 1 << 6
		secbitNoCapAmbRaiseLock = 1 << 7
	)
	bits := secbitNoRoot | secbitNoRootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLock |
		secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbRaiseLock
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return fmt.Errorf("setting securebits: %w", err)
	}
	last := capLastCap()
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("clearing capabilities: %w", e)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return nil
}
