package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/vmm"
)

// Snapshot layout: three files in one directory.
const (
	snapMeta   = "snapshot.json" // snapshotMeta
	snapState  = "state"         // QEMU migration stream without guest RAM
	snapMemory = "memory"        // guest RAM, byte for byte, pages of zeros left holes
)

// machineFormat versions the machine buildArgs describes. Bump it when a
// device or a device option changes: a snapshot of another machine is
// refused rather than loaded into a VM that only nearly matches it.
const machineFormat = 3

// snapshotMeta records what a restore must match.
type snapshotMeta struct {
	Machine int `json:"machine"`
	// StateSHA256 is the digest of the state file, checked in full on every
	// restore (it is small). The memory file is too large for that; its
	// size and modification time must match, and snapshots are never
	// written in place.
	StateSHA256   string    `json:"state_sha256"`
	MemoryBytes   int64     `json:"memory_bytes"`
	MemoryMtimeNS int64     `json:"memory_mtime_ns"`
	QEMU          string    `json:"qemu"`
	Accel         vmm.Accel `json:"accel"`
	VCPUs         int       `json:"vcpus"`
	MemMiB        int       `json:"mem_mib"`
	Disks         int       `json:"disks"`
	NIC           bool      `json:"nic"`
}

var (
	_ vmm.Snapshotter = (*Machine)(nil)
	_ vmm.Restorer    = (*Driver)(nil)
)

var _ vmm.InPlaceSnapshotter = (*Machine)(nil)

// Snapshot pauses the guest, writes its device state (a migration stream
// that leaves RAM out) and copies its RAM into dir, which must exist and be
// empty of a previous snapshot. The machine stays paused.
func (m *Machine) Snapshot(ctx context.Context, dir string) error {
	return m.snapshot(ctx, dir, false)
}

// SnapshotInPlace is Snapshot that, for a machine whose RAM is a file of
// its own (vmm.Config.RAMFile), links that file into dir as the
// snapshot's RAM instead of copying it: the machine must not run again.
// Making it durable is the caller's (an fsync of the snapshot's files).
func (m *Machine) SnapshotInPlace(ctx context.Context, dir string) error {
	return m.snapshot(ctx, dir, m.files.ramFile)
}

func (m *Machine) snapshot(ctx context.Context, dir string, inPlace bool) error {
	if m.files.mem == nil {
		return fmt.Errorf("qemu snapshot: a restored machine cannot be snapshotted again: %w", errdefs.ErrNotSupported)
	}
	t0 := time.Now()
	if _, err := m.qmp.Execute(ctx, "stop", nil); err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	if err := migrationCaps(ctx, m.qmp); err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, snapState), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	err = m.migrateFile(ctx, "migrate", f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	t1 := time.Now()
	memory := m.copyMemory
	if inPlace {
		memory = m.linkMemory
	}
	if err := memory(filepath.Join(dir, snapMemory)); err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	m.log.Debug("qemu snapshot", "stop_state_ms", ms(t1.Sub(t0)), "memory_ms", ms(time.Since(t1)))
	stateSum, err := digestFile(filepath.Join(dir, snapState))
	if err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	mem, err := os.Stat(filepath.Join(dir, snapMemory))
	if err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	meta := snapshotMeta{
		Machine:       machineFormat,
		StateSHA256:   stateSum,
		MemoryBytes:   mem.Size(),
		MemoryMtimeNS: mem.ModTime().UnixNano(),
		QEMU:          m.qmp.Version,
		Accel:         m.accel,
		VCPUs:         m.cfg.VCPUs,
		MemMiB:        m.cfg.MemMiB,
		Disks:         len(m.cfg.Disks),
		NIC:           m.cfg.Net != nil,
	}
	b, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, snapMeta), b, 0o644); err != nil {
		return fmt.Errorf("qemu snapshot: %w", err)
	}
	return nil
}

// migrationFD is the name under which the migration stream's descriptor is
// handed to QEMU.
const migrationFD = "isopod-migration"

// migrateFile runs a migration ("migrate" out of, or "migrate-incoming"
// into, this machine) through f, whose descriptor is passed over QMP, and
// waits for it to end. migrationCaps must have been set.
func (m *Machine) migrateFile(ctx context.Context, cmd string, f *os.File) error {
	// A restored machine remembers its incoming migration's end: not this
	// one's.
	m.qmp.ForgetEvents("MIGRATION")
	if _, err := m.qmp.ExecuteFile(ctx, "getfd", map[string]any{"fdname": migrationFD}, f); err != nil {
		return err
	}
	if _, err := m.qmp.Execute(ctx, cmd, map[string]any{"uri": "fd:" + migrationFD}); err != nil {
		return err
	}
	return waitMigration(ctx, m.qmp)
}

// waitMigration waits for the MIGRATION event that ends a migration.
func waitMigration(ctx context.Context, q *QMPClient) error {
	status := func(ev QMPEvent) string {
		var st struct {
			Status string `json:"status"`
		}
		json.Unmarshal(ev.Data, &st)
		return st.Status
	}
	ev, err := q.WaitEventFunc(ctx, "MIGRATION", func(ev QMPEvent) bool {
		switch status(ev) {
		case "completed", "failed", "cancelled":
			return true
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	st := status(ev)
	if st == "completed" {
		return nil
	}
	desc := ""
	if ret, err := q.Execute(ctx, "query-migrate", nil); err == nil {
		var info struct {
			ErrorDesc string `json:"error-desc"`
		}
		if json.Unmarshal(ret, &info) == nil && info.ErrorDesc != "" {
			desc = ": " + info.ErrorDesc
		}
	}
	return fmt.Errorf("migration %s%s: %w", st, desc, errdefs.ErrFailedPrecondition)
}

// copyMemory copies the guest RAM memfd (the host's own descriptor of it)
// into a sparse file at dst.
func (m *Machine) copyMemory(dst string) error {
	return copySparse(dst, m.files.mem, int64(m.cfg.MemMiB)<<20)
}

// linkMemory makes the guest's RAM file (vmm.Config.RAMFile) dst too.
func (m *Machine) linkMemory(dst string) error {
	if err := os.Link(m.cfg.RAMFile, dst); err != nil {
		return err
	}
	a, err := m.files.mem.Stat()
	b, err2 := os.Stat(dst)
	if err != nil || err2 != nil || !os.SameFile(a, b) {
		os.Remove(dst)
		return fmt.Errorf("the RAM file %s is not the guest's RAM: %w", m.cfg.RAMFile, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// copySparse copies size bytes of src to a new file dst, leaving src's
// holes and its pages of zeros holes (see sparse.go).
func copySparse(dst string, src *os.File, size int64) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := copyNonZero(out, src, size); err != nil {
		out.Close()
		os.Remove(dst)
		return fmt.Errorf("copying guest memory: %w", err)
	}
	return out.Close()
}

// Restore starts a machine from the snapshot in dir: its RAM file mapped
// privately (copy-on-write, so many machines share one snapshot) and its
// device state loaded from the migration stream. cfg must have the
// snapshot's sizes and the same number of disks and NICs, in the same
// order; their backing files, the NIC socket and the agent channel are new.
// The guest resumes where it was paused; its agent expects the host's Hello.
func (d *Driver) Restore(ctx context.Context, cfg vmm.Config, dir string) (vmm.Machine, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapMeta))
	if err != nil {
		return nil, fmt.Errorf("qemu restore: %s is not a snapshot (%v): %w", dir, errors.Unwrap(err), errdefs.ErrNotFound)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("qemu restore: %s: %w", snapMeta, err)
	}
	if meta.Machine != machineFormat {
		return nil, fmt.Errorf("qemu restore: the snapshot is of machine format %d; this driver builds format %d: %w", meta.Machine, machineFormat, errdefs.ErrFailedPrecondition)
	}
	if cfg.VCPUs != meta.VCPUs || cfg.MemMiB != meta.MemMiB || len(cfg.Disks) != meta.Disks || (cfg.Net != nil) != meta.NIC {
		return nil, fmt.Errorf("qemu restore: config (vcpus %d, %d MiB, %d disks, nic %v) differs from the snapshot's (vcpus %d, %d MiB, %d disks, nic %v): %w",
			cfg.VCPUs, cfg.MemMiB, len(cfg.Disks), cfg.Net != nil, meta.VCPUs, meta.MemMiB, meta.Disks, meta.NIC, errdefs.ErrInvalidArgument)
	}
	// The CPU model follows the accelerator, so the snapshot's is the only
	// one that fits.
	if cfg.Accel != vmm.AccelAuto && cfg.Accel != meta.Accel {
		return nil, fmt.Errorf("qemu restore: snapshot was taken under %s, not %s: %w", meta.Accel, cfg.Accel, errdefs.ErrFailedPrecondition)
	}
	if d.accel != "" && d.accel != meta.Accel {
		return nil, fmt.Errorf("qemu restore: %s=%s but the snapshot was taken under %s: %w", knobs.Accel, d.accel, meta.Accel, errdefs.ErrFailedPrecondition)
	}
	state, err := openVerified(dir, &meta)
	if err != nil {
		return nil, fmt.Errorf("qemu restore: %w", err)
	}
	defer state.Close()
	m, err := d.start(ctx, &cfg, launch{
		accel:       meta.Accel,
		snapshotRAM: filepath.Join(dir, snapMemory),
		incoming:    "defer",
	})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	err = m.files.waitRAM()
	t1 := time.Now()
	if err == nil {
		err = m.incoming(ctx, state, !cfg.Paused)
	}
	if err != nil {
		m.Kill()
		if m.Wait() != nil {
			// What QEMU said of the failure.
			if msg := strings.TrimSpace(m.proc.stderr.String()); msg != "" {
				err = fmt.Errorf("%w (QEMU: %s)", err, msg)
			}
		}
		m.agent.Close()
		return nil, fmt.Errorf("qemu restore: %w", err)
	}
	m.log.Debug("qemu restore", "ram_wait_ms", ms(t1.Sub(t0)), "load_state_ms", ms(time.Since(t1)))
	return m, nil
}

// migrationCaps makes migration leave shared RAM (the memfd, the snapshot
// file) out of the stream and report its progress as events.
func migrationCaps(ctx context.Context, q *QMPClient) error {
	_, err := q.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{
			{"capability": "x-ignore-shared", "state": true},
			{"capability": "events", "state": true},
		},
	})
	return err
}

// incoming loads the device state from state and, when run is set, lets
// the guest run.
func (m *Machine) incoming(ctx context.Context, state *os.File, run bool) error {
	if err := migrationCaps(ctx, m.qmp); err != nil {
		return err
	}
	if err := m.migrateFile(ctx, "migrate-incoming", state); err != nil {
		return err
	}
	// The stream carries the source's run state, paused: resume here.
	if !run {
		return nil
	}
	return m.Resume(ctx)
}

// Resume lets a machine restored paused (vmm.Config.Paused) run.
func (m *Machine) Resume(ctx context.Context) error {
	if _, err := m.qmp.Execute(ctx, "cont", nil); err != nil {
		return fmt.Errorf("qemu resume: %w", err)
	}
	return nil
}

// ResizeDisk cuts or grows disk i's file to bytes (QEMU's block_resize),
// which also sets the size QEMU checks the guest's requests against, and
// tells the guest.
func (m *Machine) ResizeDisk(ctx context.Context, i int, bytes int64) error {
	if i < 0 || i >= len(m.cfg.Disks) || bytes < 0 {
		return fmt.Errorf("qemu: resizing disk %d of %d to %d bytes: %w", i, len(m.cfg.Disks), bytes, errdefs.ErrInvalidArgument)
	}
	if m.cfg.Disks[i].ReadOnly {
		return fmt.Errorf("qemu: disk %d is read-only and keeps its size: %w", i, errdefs.ErrInvalidArgument)
	}
	if _, err := m.qmp.Execute(ctx, "block_resize", map[string]any{"device": "disk" + strconv.Itoa(i), "size": bytes}); err != nil {
		return fmt.Errorf("qemu: resizing disk %d: %w", i, err)
	}
	return nil
}

// openVerified opens dir's state file after checking it and the memory file
// against meta: the state's digest in full, the memory's size and
// modification time. The returned file is at offset 0, so what QEMU loads
// is what was checked.
func openVerified(dir string, meta *snapshotMeta) (*os.File, error) {
	changed := func(name, what string) error {
		return fmt.Errorf("the snapshot's %s file %s since it was taken (%s): %w", name, what, dir, errdefs.ErrFailedPrecondition)
	}
	mem, err := os.Stat(filepath.Join(dir, snapMemory))
	if err != nil {
		return nil, changed(snapMemory, "is gone")
	}
	if mem.Size() != meta.MemoryBytes || mem.ModTime().UnixNano() != meta.MemoryMtimeNS {
		return nil, changed(snapMemory, "was modified")
	}
	f, err := os.Open(filepath.Join(dir, snapState))
	if err != nil {
		return nil, changed(snapState, "is gone")
	}
	sum, err := digest(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if sum != meta.StateSHA256 {
		f.Close()
		return nil, changed(snapState, "was modified")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// digestFile is the hex sha256 of the file at path.
func digestFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return digest(f)
}

// digest is the hex sha256 of what is left to read in f.
func digest(f *os.File) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
