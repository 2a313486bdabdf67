package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"isopod/internal/machine"
	"isopod/internal/store"
	"isopod/internal/vmm"
)

// vmRecord is vms/<id>/record.json: enough to list a run and to find its VMM
// process again if isopod died.
type vmRecord struct {
	ID      string    `json:"vm_id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Argv    []string  `json:"argv,omitempty"`
	Base    string    `json:"base,omitempty"`
	Stage   string    `json:"stage,omitempty"`

	OwnerPID       int    `json:"owner_pid"`
	OwnerStartTime uint64 `json:"owner_start_time"`
	VMMPID         int    `json:"vmm_pid,omitempty"`
	VMMStartTime   uint64 `json:"vmm_start_time,omitempty"`

	Finished bool `json:"finished"`
	ExitCode *int `json:"exit_code,omitempty"`
	// Staging lists copy-out staging files while they exist, so that
	// `isopod vm gc` can remove them if this run's process dies.
	Staging []string `json:"staging,omitempty"`
}

func newVMID() string {
	var b [4]byte
	rand.Read(b[:])
	return "vm-" + hex.EncodeToString(b[:])
}

func writeRecord(dir string, r *vmRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".record.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing vm record: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "record.json"))
}

func readRecord(dir string) (*vmRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, "record.json"))
	if err != nil {
		return nil, err
	}
	r := new(vmRecord)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	return r, nil
}

// procStartTime returns field 22 of /proc/PID/stat (start time in clock ticks
// since boot), or 0 when the process does not exist or has exited.
func procStartTime(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	return parseStatStartTime(string(b))
}

// parseStatStartTime reads the start time out of a /proc/PID/stat line. The
// command name (field 2) may contain spaces and parentheses, so fields are
// counted from the last ')'.
func parseStatStartTime(stat string) uint64 {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(stat[i+1:])
	// fields[0] is field 3 (state); start time is field 22. A zombie has
	// exited: it counts as gone.
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(fields[19], 10, 64)
	return v
}

// alive reports whether pid is still the process that started at startTime.
func alive(pid int, startTime uint64) bool {
	if pid <= 0 || startTime == 0 {
		return false
	}
	return procStartTime(pid) == startTime
}

// vanityName is the VM's hostname and display name.
func vanityName(id string) string { return store.VanityName(id) }

// vmDir is a VM's directory under vms/ with its record and console log,
// made the same way for runs and snapshot builds.
type vmDir struct {
	path   string
	rec    *vmRecord
	serial *machine.CappedWriter
}

// newVMDir creates a VM directory, its record (owned by this process) and
// its console log.
func (s *Service) newVMDir(argv []string, base, stage string) (*vmDir, error) {
	p := s.opts.Paths
	if err := p.Ensure(); err != nil {
		return nil, err
	}
	id := newVMID()
	d := &vmDir{path: p.VM(id)}
	if err := os.Mkdir(d.path, 0o700); err != nil {
		return nil, fmt.Errorf("creating vm directory: %w", err)
	}
	d.rec = &vmRecord{
		ID: id, Name: vanityName(id), Created: time.Now().UTC(), Argv: argv,
		Base: base, Stage: stage,
		OwnerPID: os.Getpid(), OwnerStartTime: procStartTime(os.Getpid()),
	}
	if err := writeRecord(d.path, d.rec); err != nil {
		return nil, err
	}
	con, err := os.OpenFile(d.consolePath(), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating console log: %w", err)
	}
	d.serial = machine.NewCappedWriter(con, SerialLogCap)
	return d, nil
}

// Path is the VM directory (machine.ReadyDir).
func (d *vmDir) Path() string { return d.path }

// Finish finishes the record of a VM that ran nothing (machine.ReadyDir).
func (d *vmDir) Finish() { d.finish(nil) }

func (d *vmDir) consolePath() string { return filepath.Join(d.path, "console.log") }

// started records the VMM process, so that `isopod vm gc` finds it should
// this process die.
func (d *vmDir) started(m vmm.Machine) {
	d.rec.VMMPID, d.rec.VMMStartTime = m.Pid(), m.StartTime()
	writeRecord(d.path, d.rec)
}

// finish closes the console log and marks the record finished.
func (d *vmDir) finish(exitCode *int) {
	d.serial.Close()
	d.rec.Finished = true
	d.rec.ExitCode = exitCode
	writeRecord(d.path, d.rec)
}
