package vmrecord

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
)

// GCMinAge keeps unfinished records this young even past keep-last and
// even when their owner is gone: a run may be starting. A finished record
// has no such grace.
const GCMinAge = 60 * time.Second

// Record is vms/<id>/record.json: enough to list a run and to find its VMM
// process again if isopod died.
type Record struct {
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
	// Paused: a paused session holds the VM (its disks, its snapshot) for
	// a later resume; nothing removes it meanwhile.
	Paused   bool `json:"paused,omitempty"`
	ExitCode *int `json:"exit_code,omitempty"`
	// Staging lists copy-out staging files while they exist, so that
	// `isopod vm gc` can remove them if this run's process dies.
	Staging []string `json:"staging,omitempty"`
}

// NewID is a fresh VM id, vm- and 8 hex digits.
func NewID() string {
	var b [4]byte
	rand.Read(b[:])
	return "vm-" + hex.EncodeToString(b[:])
}

// Write writes r as dir's record, atomically.
func Write(dir string, r *Record) error {
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

// Read reads dir's record.
func Read(dir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, "record.json"))
	if err != nil {
		return nil, err
	}
	r := new(Record)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	return r, nil
}

// ProcStartTime returns field 22 of /proc/PID/stat (start time in clock ticks
// since boot), or 0 when the process does not exist or has exited.
func ProcStartTime(pid int) uint64 {
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

// Alive reports whether pid is still the process that started at startTime.
func Alive(pid int, startTime uint64) bool {
	if pid <= 0 || startTime == 0 {
		return false
	}
	return ProcStartTime(pid) == startTime
}

// ValidID reports whether id has the form of a VM id.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, "vm-")
	if !ok || len(rest) != 8 {
		return false
	}
	for _, c := range rest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// VMMRunning reports whether r's VMM process (by pid and start time) still
// runs: what a listing calls live. The owner is not asked: a long-lived
// owner (the MCP server) outlives every VM it ran.
func (r *Record) VMMRunning() bool {
	return Alive(r.VMMPID, r.VMMStartTime)
}

// Busy reports whether r still belongs to a run: it is paused, its VMM runs, or it is
// unfinished and its owner lives (a run between boots, or one whose VMM
// has not started yet).
func (r *Record) Busy() bool {
	return r.Paused || r.VMMRunning() || (!r.Finished && Alive(r.OwnerPID, r.OwnerStartTime))
}

// Prunable reports whether r may be removed past keep-last: nothing runs
// it, and it is finished, or its owner is known to be gone (it died
// mid-run), or it is older than GCMinAge.
func (r *Record) Prunable(now time.Time) bool {
	if r.Busy() {
		return false
	}
	return r.Finished || r.OwnerPID > 0 && r.OwnerStartTime > 0 || now.Sub(r.Created) >= GCMinAge
}
