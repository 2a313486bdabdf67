package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"isopod/internal/jail"
)

// kvmFacts are what the host says about KVM before any guest is tried:
// whether the CPU offers hardware virtualization, whether /dev/kvm exists
// and who may open it, and who the VMM runs as. They name the real reason
// KVM cannot be used, where a failed open or probe would only say
// "permission denied".
type kvmFacts struct {
	// CPUFlag is "vmx" or "svm" when /proc/cpuinfo lists one, "" when
	// it lists neither, "?" when it cannot be read.
	CPUFlag string
	// Dev is /dev/kvm; nil when it does not exist.
	Dev *devNode
	// Open is what opening /dev/kvm read-write as isopod gave.
	Open error
	// VMM is who a jailed VMM runs as; nil when VMMs run as isopod.
	VMM *vmmCreds
}

// devNode is a device node's mode and owners.
type devNode struct {
	Path     string
	Mode     fs.FileMode
	UID, GID int
	Owner    string // user name, or the uid
	Group    string // group name, or the gid
}

// vmmCreds are the host ids a jailed VMM runs as.
type vmmCreds struct {
	UID, GID int
	Groups   []int
}

// readKVMFacts reads the facts of this host; j is the jail VMMs run in
// (nil: none).
func readKVMFacts(j *jail.Jailer) kvmFacts {
	f := kvmFacts{CPUFlag: "?"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		f.CPUFlag = cpuVirtFlag(b)
	}
	f.Dev = statDev("/dev/kvm")
	f.Open = openDevKVM()
	if j != nil {
		f.VMM = &vmmCreds{UID: j.UID(), GID: j.GID(), Groups: j.Groups()}
	}
	return f
}

// cpuVirtFlag returns "vmx" or "svm" when the flags of /proc/cpuinfo list
// one, else "".
func cpuVirtFlag(cpuinfo []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, fl := range strings.Fields(v) {
			if fl == "vmx" || fl == "svm" {
				return fl
			}
		}
		return ""
	}
	return ""
}

// statDev describes the node at path; nil when there is none.
func statDev(path string) *devNode {
	st, err := os.Stat(path)
	if err != nil {
		return nil
	}
	n := &devNode{Path: path, Mode: st.Mode()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		n.UID, n.GID = int(sys.Uid), int(sys.Gid)
	}
	n.Owner = strconv.Itoa(n.UID)
	if u, err := user.LookupId(n.Owner); err == nil {
		n.Owner = u.Username
	}
	n.Group = strconv.Itoa(n.GID)
	if g, err := user.LookupGroupId(n.Group); err == nil {
		n.Group = g.Name
	}
	return n
}

// String renders the node with its mode and owners as ls shows them:
// "/dev/kvm (crw-rw---- root:kvm)".
func (n *devNode) String() string {
	return fmt.Sprintf("%s (%s %s:%s)", n.Path, modeString(n.Mode), n.Owner, n.Group)
}

// modeString is ls's mode column for a character device.
func modeString(m fs.FileMode) string {
	s := m.String() // "Dcrw-rw----" for a character device
	if i := strings.IndexAny(s, "-r"); i > 0 {
		s = s[i:]
	}
	return "c" + s
}

// allows reports whether the mode bits let uid (with gid and groups) open
// n read-write; root's capabilities are not counted (a jailed VMM has
// none).
func (n *devNode) allows(uid, gid int, groups []int) bool {
	perm := n.Mode.Perm()
	switch {
	case uid == n.UID:
		return perm&0o600 == 0o600
	case gid == n.GID || slices.Contains(groups, n.GID):
		return perm&0o060 == 0o060
	}
	return perm&0o006 == 0o006
}

// cpuNote says what /proc/cpuinfo tells of hardware virtualization when
// it offers none ("" when it does, or cannot be read).
func (f kvmFacts) cpuNote() string {
	if f.CPUFlag != "" {
		return ""
	}
	return "the CPU offers no hardware virtualization (/proc/cpuinfo lists neither vmx nor svm)"
}

// obstacle says why KVM cannot be used here, as a clause; "" when the
// facts do not rule it out (only a probe guest can tell then).
func (f kvmFacts) obstacle() string {
	cpu := f.cpuNote()
	if f.Dev == nil {
		if cpu != "" {
			return "there is no /dev/kvm, and " + cpu
		}
		module := "the KVM module"
		switch f.CPUFlag {
		case "vmx":
			module = "kvm_intel"
		case "svm":
			module = "kvm_amd"
		}
		return fmt.Sprintf("there is no /dev/kvm although the CPU has %s: load %s (modprobe %s)", f.CPUFlag, module, module)
	}
	var access string
	switch {
	case f.Open != nil:
		access = f.hostAccess()
	case f.VMM != nil && !f.Dev.allows(f.VMM.UID, f.VMM.GID, f.VMM.Groups):
		access = f.vmmAccess()
	}
	switch {
	case cpu != "" && access != "":
		return cpu + "; besides, " + access
	case cpu != "":
		return ""
	}
	return access
}

// hostAccess says why /dev/kvm does not open for isopod itself.
func (f kvmFacts) hostAccess() string {
	s := fmt.Sprintf("%s does not open for isopod's uid %d (%v)", f.Dev, os.Geteuid(), errText(f.Open))
	switch {
	case !errors.Is(f.Open, fs.ErrPermission):
		return s
	case f.Dev.Mode.Perm()&0o060 != 0o060:
		return s + fmt.Sprintf(": only its owner %s may open it; give it the group kvm and mode 0660, as udev's rule for it does, and put your user in that group", f.Dev.Owner)
	}
	return s + fmt.Sprintf(": your user needs its group %s (sudo usermod -aG %s $USER, then log in again)", f.Dev.Group, f.Dev.Group)
}

// vmmAccess says why the jailed VMM's ids cannot open /dev/kvm.
func (f kvmFacts) vmmAccess() string {
	v := f.VMM
	groups := "no supplementary group"
	if len(v.Groups) > 0 {
		var names []string
		for _, g := range v.Groups {
			names = append(names, groupName(g))
		}
		groups = "the groups " + strings.Join(names, ", ")
	}
	s := fmt.Sprintf("%s does not open for the jailed VMM, which runs as uid %d, gid %d with %s", f.Dev, v.UID, v.GID, groups)
	switch {
	case f.Dev.Mode.Perm()&0o060 != 0o060:
		return s + fmt.Sprintf(": only its owner %s may open it; give it the group kvm and mode 0660, as udev's rule for it does", f.Dev.Owner)
	case len(v.Groups) == 0:
		return s + fmt.Sprintf(": it would need the group %s, and a VMM under a subordinate id keeps none; run isopod as root (its VMM keeps the group kvm)", f.Dev.Group)
	}
	return s + fmt.Sprintf(": it would need the group %s; the jail keeps only the group kvm, so give /dev/kvm the group kvm, as udev's rule for it does", f.Dev.Group)
}

// errText is err without the operation and path of an *fs.PathError.
func errText(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// groupName names gid, or gives the number.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}

// fix says what would let KVM be used, for `isopod doctor`; "" when the
// facts do not rule it out.
func (f kvmFacts) fix() string {
	switch {
	case f.obstacle() == "":
		return ""
	case f.CPUFlag == "":
		return "use a host whose CPU offers VT-x or AMD-V (enabled in its firmware; on a VM, nested virtualization); until then runs use TCG"
	case f.Dev == nil:
		return "load the KVM module for this CPU (modprobe kvm_intel or kvm_amd)"
	}
	return "give /dev/kvm the group and mode the reason names (udev's rule: group kvm, mode 0660)"
}
