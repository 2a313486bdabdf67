package vmrecord

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/machine"
	"isopod/internal/paths"
	"isopod/internal/store"
	"isopod/internal/vmm"
)

// Dir is a VM's directory under vms/ with its record and console log,
// made the same way for runs, ready VMs and snapshot builds.
type Dir struct {
	path string
	// Rec is the record as last written (Save writes it again).
	Rec *Record
	// Serial is the console log, capped at machine.SerialLogCap.
	Serial *machine.CappedWriter
}

// NewDir creates a VM directory under p, its record (owned by this
// process) and its console log.
func NewDir(p paths.Paths, argv []string, base, stage string) (*Dir, error) {
	if err := p.Ensure(); err != nil {
		return nil, err
	}
	id := NewID()
	d := &Dir{path: p.VM(id)}
	if err := os.Mkdir(d.path, 0o700); err != nil {
		return nil, fmt.Errorf("creating vm directory: %w", err)
	}
	d.Rec = &Record{
		ID: id, Name: store.VanityName(id), Created: time.Now().UTC(), Argv: argv,
		Base: base, Stage: stage,
		OwnerPID: os.Getpid(), OwnerStartTime: ProcStartTime(os.Getpid()),
	}
	if err := d.Save(); err != nil {
		return nil, err
	}
	con, err := os.OpenFile(d.ConsolePath(), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating console log: %w", err)
	}
	d.Serial = machine.NewCappedWriter(con, machine.SerialLogCap)
	return d, nil
}

// Path is the VM directory (machine.ReadyDir).
func (d *Dir) Path() string { return d.path }

// Finish finishes the record of a VM that ran nothing (machine.ReadyDir).
func (d *Dir) Finish() { d.End(nil) }

// ConsolePath is the guest console's log.
func (d *Dir) ConsolePath() string { return filepath.Join(d.path, "console.log") }

// Save writes the record again.
func (d *Dir) Save() error { return Write(d.path, d.Rec) }

// Started records the VMM process, so that `isopod vm gc` finds it should
// this process die.
func (d *Dir) Started(m vmm.Machine) {
	d.Rec.VMMPID, d.Rec.VMMStartTime = m.Pid(), m.StartTime()
	d.Save()
}

// End closes the console log and marks the record finished.
func (d *Dir) End(exitCode *int) {
	d.Serial.Close()
	d.Rec.Finished = true
	d.Rec.ExitCode = exitCode
	d.Save()
}

// Pause closes the console log and marks the record paused: its VM's
// disks stay for a resume (Reopen), and nothing prunes it meanwhile.
func (d *Dir) Pause() {
	d.Serial.Close()
	d.Rec.Paused = true
	d.Rec.VMMPID, d.Rec.VMMStartTime = 0, 0
	d.Save()
}

// Reopen takes over the paused VM directory path for this process: its
// record owned by it and no longer paused, its console log appended to.
func Reopen(path string) (*Dir, error) {
	rec, err := Read(path)
	if err != nil {
		return nil, err
	}
	con, err := os.OpenFile(filepath.Join(path, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening console log: %w", err)
	}
	d := &Dir{path: path, Rec: rec, Serial: machine.NewCappedWriter(con, machine.SerialLogCap)}
	rec.Paused, rec.Finished = false, false
	rec.OwnerPID, rec.OwnerStartTime = os.Getpid(), ProcStartTime(os.Getpid())
	if err := d.Save(); err != nil {
		con.Close()
		return nil, err
	}
	return d, nil
}
