package agent

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Commands run confined, so that no command can take the agent down with
// it: every exec gets its own cgroup (v2) under one parent that caps what
// all commands together may use. The agent itself stays in the root cgroup,
// outside the caps.
const (
	cgroupMount = "/sys/fs/cgroup"
	// CommandCgroup is the parent of every exec's cgroup.
	CommandCgroup = cgroupMount + "/isopod"
	// CommandPidsMax caps the processes (and threads) of all commands.
	CommandPidsMax = 4096
	// commandMemReserveMin is the least memory kept for the agent and the
	// kernel; a command may use the rest (see commandMemMax).
	commandMemReserveMin = 48 << 20
	// cgroupKillWait bounds how long an exec's end waits for its cgroup to
	// empty after killing it.
	cgroupKillWait = 2 * time.Second
)

// commandMemMax is how much memory all commands together may use in a
// guest with memTotal bytes: all but an eighth, and at least
// commandMemReserveMin is kept.
func commandMemMax(memTotal int64) int64 {
	reserve := max(memTotal/8, commandMemReserveMin)
	return max(memTotal-reserve, 16<<20)
}

// Cgroups confines commands. The zero value (no cgroups) confines nothing.
type Cgroups struct {
	parent string // CommandCgroup; "" when unavailable
	log    *slog.Logger

	mu        sync.Mutex
	leftovers []string // cgroups of kept execs and jobs, removed once empty
	// spare is a cgroup made ahead for the next exec (see refill);
	// spareSeq numbers the spares.
	spare    spare[execCgroup]
	spareSeq atomic.Uint64
	// tidying counts finished execs whose cgroup is still being removed
	// or whose successor is being made; tidied signals it reaching 0.
	tidying int
	tidied  *sync.Cond
}

// begin and end bracket the clean-up of a finished exec (nil-safe).
func (g *Cgroups) begin() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.tidying++
	g.mu.Unlock()
}

func (g *Cgroups) end() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.tidying--; g.tidying == 0 && g.tidied != nil {
		g.tidied.Broadcast()
	}
	g.mu.Unlock()
}

// settle waits until every finished exec's clean-up is done: before a
// snapshot, so that no clone finishes it while it answers its first
// request.
func (g *Cgroups) settle() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tidied == nil {
		g.tidied = sync.NewCond(&g.mu)
	}
	for g.tidying > 0 {
		g.tidied.Wait()
	}
}

// setupCgroups mounts cgroup2, enables the cpu, memory and pids controllers
// and makes the commands' parent group with its caps. Commands get a lower
// CPU weight than the agent's threads, so a busy command cannot starve it.
func setupCgroups(log *slog.Logger) (*Cgroups, error) {
	if err := mountAt("cgroup2", cgroupMount, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return &Cgroups{log: log}, err
	}
	if err := writeFile(filepath.Join(cgroupMount, "cgroup.subtree_control"), "+cpu +memory +pids"); err != nil {
		return &Cgroups{log: log}, err
	}
	if err := os.Mkdir(CommandCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return &Cgroups{log: log}, err
	}
	mem, err := memTotal("/proc/meminfo")
	if err != nil {
		return &Cgroups{log: log}, err
	}
	for name, value := range map[string]string{
		"pids.max":               strconv.Itoa(CommandPidsMax),
		"memory.max":             strconv.FormatInt(commandMemMax(mem), 10),
		"memory.swap.max":        "0",
		"cpu.weight":             "10",
		"cgroup.subtree_control": "+cpu +memory +pids",
	} {
		if err := writeFile(filepath.Join(CommandCgroup, name), value); err != nil && !errors.Is(err, os.ErrNotExist) {
			return &Cgroups{log: log}, err
		}
	}
	log.Info("commands confined", "pids_max", CommandPidsMax, "memory_max", commandMemMax(mem))
	g := &Cgroups{parent: CommandCgroup, log: log}
	g.refill()
	return g, nil
}

// execCgroup is one exec's cgroup. A nil *execCgroup (commands not
// confined) does nothing.
type execCgroup struct {
	fd int // for clone3(CLONE_INTO_CGROUP)
	// kill is its cgroup.kill, opened with the cgroup (-1: not open), so
	// that ending an exec's processes is one write.
	kill int
	dir  string
	log  *slog.Logger
	g    *Cgroups
}

// confined reports whether commands run in cgroups of their own.
func (g *Cgroups) confined() bool { return g != nil && g.parent != "" }

// forExec makes exec id's cgroup, or returns nil when commands are not
// confined (or the cgroup cannot be made, which is logged).
func (g *Cgroups) forExec(id uint64) *execCgroup {
	if !g.confined() {
		return nil
	}
	if e := g.spare.take(); e != nil {
		return e
	}
	g.sweep()
	return g.make("exec-" + strconv.FormatUint(id, 10))
}

// A cgroup is made ahead for the next exec, at boot and after each exec
// ends (once its reply is sent), so that making one (the kernel's
// per-controller setup) is off the path of an exec's start. Above all, a
// snapshot's clone then starts its first command in a cgroup its snapshot
// already holds.

// refill makes a spare cgroup when there is none; a nil or unconfined
// Cgroups does nothing.
func (g *Cgroups) refill() {
	if !g.confined() || g.spare.ready() {
		return
	}
	name := "spare-" + strconv.FormatUint(g.spareSeq.Add(1), 10)
	g.sweep()
	if e := g.make(name); e != nil {
		g.spare.put(e, (*execCgroup).release)
	}
}

// make makes the cgroup name under the parent and opens it, or returns nil
// (logged) when it cannot.
func (g *Cgroups) make(name string) *execCgroup {
	dir := filepath.Join(g.parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		g.log.Warn("making an exec's cgroup", "err", err)
		return nil
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		g.log.Warn("opening an exec's cgroup", "err", err)
		os.Remove(dir)
		return nil
	}
	kill, err := unix.Open(filepath.Join(dir, "cgroup.kill"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		kill = -1 // killAll opens it then, and says why it cannot
	}
	return &execCgroup{fd: fd, kill: kill, dir: dir, log: g.log, g: g}
}

// closeFDs closes the cgroup's descriptors.
func (e *execCgroup) closeFDs() {
	unix.Close(e.fd)
	if e.kill >= 0 {
		unix.Close(e.kill)
	}
}

// sweep removes the leftover cgroups that have emptied.
func (g *Cgroups) sweep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	kept := g.leftovers[:0]
	for _, dir := range g.leftovers {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			kept = append(kept, dir)
		}
	}
	g.leftovers = kept
}

// killLeftovers kills what runs in the leftover cgroups.
func (g *Cgroups) killLeftovers() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, dir := range g.leftovers {
		writeFile(filepath.Join(dir, "cgroup.kill"), "1")
	}
}

// release ends the use of a kept exec's or job's cgroup without killing
// what still runs in it: it is removed now when empty, else by a later
// exec's sweep once it is.
func (e *execCgroup) release() {
	if e == nil {
		return
	}
	e.closeFDs()
	if err := os.Remove(e.dir); err == nil || errors.Is(err, os.ErrNotExist) {
		return
	}
	e.g.mu.Lock()
	e.g.leftovers = append(e.g.leftovers, e.dir)
	e.g.mu.Unlock()
}

// signalAll sends sig to every process still in the cgroup, those that
// left the command's process group included.
func (e *execCgroup) signalAll(sig unix.Signal) error {
	if e == nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(e.dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// killAll kills every process in the cgroup, including those that left
// the command's process group.
func (e *execCgroup) killAll() {
	if e == nil {
		return
	}
	if e.kill >= 0 {
		if _, err := unix.Pwrite(e.kill, []byte("1"), 0); err == nil {
			return
		}
	}
	if err := writeFile(filepath.Join(e.dir, "cgroup.kill"), "1"); err != nil {
		e.log.Warn("killing an exec's cgroup", "err", err)
	}
}

// remove kills what is left and removes the cgroup once it is empty.
func (e *execCgroup) remove() {
	if e == nil {
		return
	}
	e.killAll()
	e.closeFDs()
	deadline := time.Now().Add(cgroupKillWait)
	for {
		err := os.Remove(e.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			e.log.Warn("an exec's cgroup did not empty", "dir", e.dir, "err", err)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// memTotal reads MemTotal from a meminfo file, in bytes.
func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", path, fields[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s: no MemTotal line", path)
}

func writeFile(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, path, err)
	}
	return nil
}
