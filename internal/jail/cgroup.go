//go:build linux

package jail

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupKind is which cgroup interface jailed VMMs are capped with.
type cgroupKind string

const (
	cgroupV2   cgroupKind = "v2"
	cgroupV1   cgroupKind = "v1"
	cgroupNone cgroupKind = "none" // rlimits instead
)

// cgroupPlan says where each VMM's cgroup is made.
type cgroupPlan struct {
	kind cgroupKind
	// parents are the directories under which a VMM's cgroup is made: one
	// (v2) or one per controller hierarchy (v1: memory, pids, cpu).
	parents []string
}

// v1Controllers are the hierarchies a v1 VMM cgroup is made in. Not cpu:
// under v1 a group competes with every process of its parent one by one, so
// a VMM in a group of its own would get less CPU on a busy host than an
// unconfined one; it keeps the scheduler's default share instead.
var v1Controllers = []string{"memory", "pids"}

// planCgroups finds where VMM cgroups can be made: as root, under this
// process's own cgroup (v1) or the root's isopod group (v2); as a normal
// user, in a delegated v2 subtree. Without one (for root too: no cgroup
// filesystem is mounted inside `ip netns exec`, which remounts /sys, nor
// in many containers) the VMM gets rlimits and a warning that says why.
func planCgroups(root string, euid int) (cgroupPlan, []string) {
	own := ownCgroups("/proc/self/cgroup")
	var why string
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		if p, ok := planV2(root, own[""], euid); ok {
			return p, nil
		}
		why = fmt.Sprintf("the cgroup v2 hierarchy at %s does not offer the memory and pids controllers", root)
		if euid != 0 {
			why = fmt.Sprintf("this user has no delegated cgroup v2 subtree with the memory and pids controllers under %s", root)
		}
	} else if euid == 0 {
		p := cgroupPlan{kind: cgroupV1}
		var missing []string
		for _, c := range v1Controllers {
			dir := filepath.Join(root, c)
			if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
				missing = append(missing, dir)
			}
			p.parents = append(p.parents, filepath.Join(dir, own[c], "isopod"))
		}
		if len(missing) == 0 {
			return p, nil
		}
		why = fmt.Sprintf("neither the unified cgroup v2 hierarchy nor the v1 hierarchy %s is mounted", strings.Join(missing, ", "))
		if ents, _ := os.ReadDir(root); len(ents) == 0 {
			why = fmt.Sprintf("no cgroup filesystem is mounted at %s", root)
		}
		why += " (`ip netns exec` remounts /sys without them; many containers have none)"
	} else {
		why = fmt.Sprintf("a normal user has no cgroup of its own outside a delegated cgroup v2 subtree, and %s holds no cgroup v2 hierarchy", root)
	}
	fix := "run isopod as root, or in a systemd user session on cgroup v2, for cgroup caps"
	if euid == 0 {
		fix = "mount the cgroup v1 memory and pids hierarchies or the unified cgroup v2 one there, for cgroup caps " +
			"(to run in a network namespace, `nsenter --net=/run/netns/NAME` keeps the host's /sys, where `ip netns exec` does not)"
	}
	warn := fmt.Sprintf("no cgroup can be had for the VMM: %s, so its memory and processes are capped with rlimits instead; %s", why, fix)
	return cgroupPlan{kind: cgroupNone}, []string{warn}
}

// planV2 finds the parent for VMM cgroups on the unified hierarchy: for
// root, isopod/ under the root cgroup; for a user, isopod/ under the
// highest ancestor of its own cgroup that it owns (the delegated subtree).
func planV2(root, own string, euid int) (cgroupPlan, bool) {
	base := root
	if euid != 0 {
		base = ""
		for dir := filepath.Join(root, own); strings.HasPrefix(dir, root) && dir != root; dir = filepath.Dir(dir) {
			var st syscall.Stat_t
			if syscall.Stat(dir, &st) != nil || int(st.Uid) != euid {
				break
			}
			base = dir
		}
		if base == "" {
			return cgroupPlan{}, false
		}
	}
	ctrls, err := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
	if err != nil {
		return cgroupPlan{}, false
	}
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(strings.Fields(string(ctrls)), c) {
			return cgroupPlan{}, false
		}
	}
	return cgroupPlan{kind: cgroupV2, parents: []string{filepath.Join(base, "isopod")}}, true
}

// ownCgroups reads a /proc/PID/cgroup file: controller -> path ("" for the
// unified hierarchy).
func ownCgroups(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// Limits cap one VMM.
type Limits struct {
	MemoryBytes int64 // the VMM's memory, guest RAM included
	Pids        int   // processes and threads
	CPUWeight   int   // 1..10000, 100 is the default share
}

// vmCgroup is one VMM's cgroup.
type vmCgroup struct {
	kind cgroupKind
	dirs []string
	fd   *os.File // v2: the directory, for clone3(CLONE_INTO_CGROUP)
	// tasks are a v1 cgroup's tasks files, given to the VMM's uid: the
	// helper's thread that executes the VMM joins by writing 0 there,
	// which costs the kernel a fraction of a millisecond where moving a
	// process by its pid waits for an RCU grace period (several
	// milliseconds). Empty where they could not be given; then attach.
	tasks []string
}

// create makes a VMM's cgroup named name with lim, rolling back on
// failure; a v1 cgroup's tasks files go to uid and gid, the VMM's. It
// returns nil when the plan has no cgroups.
func (p cgroupPlan) create(name string, lim Limits, uid, gid int) (*vmCgroup, error) {
	if p.kind == cgroupNone {
		return nil, nil
	}
	c := &vmCgroup{kind: p.kind}
	ok := false
	defer func() {
		if !ok {
			c.remove()
		}
	}()
	for i, parent := range p.parents {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, failed(fmt.Sprintf("cannot make the cgroup %s (%v)", parent, err), "check the cgroup filesystem is writable")
		}
		if p.kind == cgroupV2 {
			enableV2(parent)
		}
		dir := filepath.Join(parent, name)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) {
			// Left by a VMM of the same name that is still exiting.
			(&vmCgroup{dirs: []string{dir}}).remove()
			err = os.Mkdir(dir, 0o755)
		}
		if err != nil {
			return nil, failed(fmt.Sprintf("cannot make the cgroup %s (%v)", dir, err), "check the cgroup filesystem is writable")
		}
		c.dirs = append(c.dirs, dir)
		if err := writeLimits(p.kind, v1ControllerAt(p, i), dir, lim); err != nil {
			return nil, err
		}
		if t := filepath.Join(dir, "tasks"); p.kind == cgroupV1 && os.Chown(t, uid, gid) == nil {
			c.tasks = append(c.tasks, t)
		}
	}
	if len(c.tasks) != len(c.dirs) {
		c.tasks = nil // all or none: attach moves it into every one
	}
	if p.kind == cgroupV2 {
		f, err := os.Open(c.dirs[0])
		if err != nil {
			return nil, failed(fmt.Sprintf("cannot open the cgroup %s (%v)", c.dirs[0], err), "check the cgroup filesystem")
		}
		c.fd = f
	}
	ok = true
	return c, nil
}

func v1ControllerAt(p cgroupPlan, i int) string {
	if p.kind == cgroupV1 {
		return v1Controllers[i]
	}
	return ""
}

// enableV2 turns on the controllers VMM cgroups use in parent's subtree
// and in the directory above it; failures show up when the limits are
// written.
func enableV2(parent string) {
	for _, d := range []string{filepath.Dir(parent), parent} {
		os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0)
	}
}

// writeLimits writes lim into dir (controller is the v1 hierarchy).
func writeLimits(kind cgroupKind, controller, dir string, lim Limits) error {
	var files map[string]string
	switch {
	case kind == cgroupV2:
		files = map[string]string{"memory.max": itoa64(lim.MemoryBytes), "memory.swap.max": "0",
			"pids.max": strconv.Itoa(lim.Pids), "cpu.weight": strconv.Itoa(lim.CPUWeight)}
	case controller == "memory":
		files = map[string]string{"memory.limit_in_bytes": itoa64(lim.MemoryBytes)}
	case controller == "pids":
		files = map[string]string{"pids.max": strconv.Itoa(lim.Pids)}
	}
	for name, v := range files {
		err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0)
		if err != nil && !(name == "memory.swap.max" && errors.Is(err, os.ErrNotExist)) && !(name == "cpu.weight" && errors.Is(err, os.ErrNotExist)) {
			return failed(fmt.Sprintf("cannot set %s in %s (%v)", name, dir, err), "enable the memory and pids cgroup controllers")
		}
	}
	return nil
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

// attach moves pid into a v1 cgroup whose tasks files could not be given
// to the VMM's uid (v2 VMMs are cloned into theirs).
func (c *vmCgroup) attach(pid int) error {
	if c == nil || c.kind != cgroupV1 || len(c.tasks) > 0 {
		return nil
	}
	for _, d := range c.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("jail: placing the VMM in %s: %w", d, err)
		}
	}
	return nil
}

// removeTries bounds the wait, in 10 ms steps, for a cgroup's last
// process to leave it: a killed VMM with gigabytes of guest RAM takes a
// while to free them on a loaded host.
const removeTries = 300

// remove deletes the cgroup once its processes are gone. Idempotent.
func (c *vmCgroup) remove() {
	if c == nil {
		return
	}
	if c.fd != nil {
		c.fd.Close()
		c.fd = nil
	}
	for _, d := range c.dirs {
		for i := 0; i < removeTries; i++ {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(10 * time.Millisecond) // the last thread is still exiting
		}
	}
	c.dirs = nil
}

// CgroupName is the cgroup name of the VMM of VM vmID: drivers name their
// Spec with it, and housekeeping finds a dead VMM's cgroup by it. It
// carries the Jailer's scope.
func (j *Jailer) CgroupName(vmID string) string { return j.cgroupPrefix() + vmID }

// cgroupPrefix starts the names of this scope's cgroups.
func (j *Jailer) cgroupPrefix() string {
	if j.scope == "" {
		return "isopod-"
	}
	return "isopod-" + j.scope + "-"
}

// RemoveCgroup removes the cgroup named name once it is empty (its VMM
// gone), e.g. one a killed isopod process could not remove; a VMM that is
// still exiting is waited for, briefly.
func (j *Jailer) RemoveCgroup(name string) {
	if name == "" || strings.ContainsAny(name, "/.") {
		return
	}
	c := &vmCgroup{}
	for _, parent := range j.cgroups.parents {
		c.dirs = append(c.dirs, filepath.Join(parent, name))
	}
	c.remove()
}

// SweepCgroups removes the VMM cgroups of this scope under this process's
// parents whose VM keep does not claim: processes still in one (a VMM
// whose run and record are gone) are killed first. Other scopes' cgroups
// are never touched. It returns the names removed.
func (j *Jailer) SweepCgroups(keep func(vmID string) bool) []string {
	seen := map[string]bool{}
	var removed []string
	for _, parent := range j.cgroups.parents {
		entries, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			id, ok := strings.CutPrefix(name, j.cgroupPrefix())
			if !e.IsDir() || !ok || strings.Contains(id, "-") && !strings.HasPrefix(id, "vm-") || seen[name] || keep(id) {
				continue
			}
			seen[name] = true
			for _, p := range j.cgroups.parents {
				killProcs(filepath.Join(p, name))
			}
			j.RemoveCgroup(name)
			removed = append(removed, name)
		}
	}
	return removed
}

// killProcs sends SIGKILL to every process listed in the cgroup dir.
func killProcs(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
