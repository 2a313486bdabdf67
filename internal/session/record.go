// Package session keeps the host's record of sessions: VMs that outlive
// the call that started them, each owned by a supervisor process
// (`isopod session-supervisor`) that serves a unix socket in the
// session's directory. This package holds the record
// ($ISOPOD_HOME/sessions/<id>/session.json), the socket's protocol and its
// client; the supervisor itself is in session/supervisor.
package session

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/vmrecord"
)

// States of a session.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateLost     = "lost"
	// StatePaused: the VM's memory and device state are on disk in the
	// session's directory (Store.PauseDir), its disks kept; no process
	// runs for it until a resume.
	StatePaused = "paused"
)

// What a session does at its idle timeout.
const (
	IdlePause = "pause"
	IdleStop  = "stop"
)

// Defaults of a session's limits.
const (
	DefaultIdleTimeoutS = 600
	DefaultMaxLifetimeS = 86400
)

// Spec is the run-like request a session was started with: what its VM
// is. It is the flags of `isopod session start`, kept for the supervisor.
type Spec struct {
	Stage          string   `json:"stage,omitempty"`
	Base           string   `json:"base,omitempty"`
	NoNetwork      bool     `json:"no_network,omitempty"`
	AllowLANEgress bool     `json:"allow_lan_egress,omitempty"`
	AllowHosts     []string `json:"allow_hosts,omitempty"`
	AllowCIDRs     []string `json:"allow_cidrs,omitempty"`
	DenyEgress     bool     `json:"deny_egress,omitempty"`
	Inject         []string `json:"inject,omitempty"`
	VCPUs          int      `json:"vcpus,omitempty"`
	MemMiB         int      `json:"mem_mib,omitempty"`
	ScratchMiB     int      `json:"scratch_mib,omitempty"`
	BootTimeoutS   int      `json:"boot_timeout_s,omitempty"`
	Env            []string `json:"env,omitempty"`
	Cwd            string   `json:"cwd,omitempty"`
	// The workspace copied in at start (an absolute host directory), and
	// its caps.
	WorkspaceHost     string `json:"workspace_host,omitempty"`
	WorkspaceGuest    string `json:"workspace_guest,omitempty"`
	WorkspaceAll      bool   `json:"workspace_all,omitempty"`
	WorkspaceMaxBytes int64  `json:"workspace_max_bytes,omitempty"`
	WorkspaceMaxFiles int    `json:"workspace_max_files,omitempty"`
	// DefaultBase is the front end's default base (sandbox.Request's);
	// ModelCaller: a model named the credentials (over MCP), so only
	// aliases marked for MCP resolve.
	DefaultBase string `json:"default_base,omitempty"`
	ModelCaller bool   `json:"model_caller,omitempty"`
}

// Record is one session's session.json.
type Record struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Spec   Spec   `json:"request"`
	VMID   string `json:"vm_id,omitempty"`
	// Path is how the VM started: "cold" (booted) or "warm" (resumed
	// from the warm pool); GuestIP its address when it has a network.
	Path    string `json:"path,omitempty"`
	GuestIP string `json:"guest_ip,omitempty"`
	// Warnings are what a run's report would warn of this VM (a jail
	// that is off, a default base that is not built).
	Warnings     []string  `json:"warnings,omitempty"`
	Created      time.Time `json:"created"`
	LastUsed     time.Time `json:"last_used"`
	Stopped      time.Time `json:"stopped,omitzero"`
	IdleTimeoutS int       `json:"idle_timeout_s"`
	MaxLifetimeS int       `json:"max_lifetime_s"`
	// SupervisorPID and SupervisorStart (field 22 of /proc/PID/stat) name
	// the supervisor, so that a reused pid is not taken for it.
	SupervisorPID   int    `json:"supervisor_pid,omitempty"`
	SupervisorStart uint64 `json:"supervisor_start_time,omitempty"`
	Socket          string `json:"socket"`
	Execs           int    `json:"execs"`
	// Exposed are the guest ports relayed on host ports, for the
	// session's life.
	Exposed []Exposed `json:"exposed,omitempty"`
	// IdleAction is what the idle timeout does: IdlePause ("": the same)
	// or IdleStop.
	IdleAction string `json:"idle_action,omitempty"`
	// Paused, PauseMS, MemoryBytes and DiskBytes describe the last pause:
	// when, how long it took, and the bytes its snapshot and the VM's
	// disks hold on disk. ResumeMS is how long the last resume's restore
	// and the guest's hello took (what a warm run's resume_ms spans),
	// ResumeTotalMS its whole (a fork's copy of its parent's VM, the
	// admission, the network, the guest made current).
	Paused        time.Time `json:"paused,omitzero"`
	PauseMS       int64     `json:"pause_ms,omitempty"`
	MemoryBytes   int64     `json:"memory_bytes,omitempty"`
	DiskBytes     int64     `json:"disk_bytes,omitempty"`
	ResumeMS      int64     `json:"resume_ms,omitempty"`
	ResumeTotalMS int64     `json:"resume_total_ms,omitempty"`
}

// PausesOnIdle reports whether r's idle timeout pauses it.
func (r *Record) PausesOnIdle() bool { return r.IdleAction != IdleStop }

// CheckIdleAction refuses what is not an idle action.
func CheckIdleAction(a string) error {
	if a != IdlePause && a != IdleStop {
		return fmt.Errorf("idle action %q: want pause or stop: %w", a, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Exposed is one guest port relayed on a host address.
type Exposed struct {
	GuestPort int    `json:"guest_port"`
	Address   string `json:"address"`
}

// Live reports whether r is starting or running by its record.
func (r *Record) Live() bool { return r.State == StateStarting || r.State == StateRunning }

// Store is the sessions under one state root.
type Store struct{ Paths paths.Paths }

// Dir is where the sessions live.
func (s Store) Dir() string { return filepath.Join(s.Paths.Home, "sessions") }

// SessionDir is session id's directory.
func (s Store) SessionDir(id string) string { return filepath.Join(s.Dir(), id) }

// PauseDir is where a paused session id's snapshot is.
func (s Store) PauseDir(id string) string { return filepath.Join(s.SessionDir(id), "paused") }

// PausedBytes is what the paused sessions hold on disk, but for the
// session except.
func (s Store) PausedBytes(except string) int64 {
	var n int64
	for _, r := range s.List() {
		if r.State == StatePaused && r.ID != except {
			n += r.MemoryBytes + r.DiskBytes
		}
	}
	return n
}

// Socket is session id's control socket.
func (s Store) Socket(id string) string { return filepath.Join(s.SessionDir(id), "ctl.sock") }

var (
	idRE   = regexp.MustCompile(`^ss-[0-9a-f]{12}$`)
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
)

// ValidID reports whether id has the form of a session id.
func ValidID(id string) bool { return idRE.MatchString(id) }

// CheckName refuses a name that is not a session name.
func CheckName(name string) error {
	if !nameRE.MatchString(name) || strings.HasPrefix(name, "ss-") {
		return fmt.Errorf("session name %q: use 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not ss-: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Create makes a new session's directory (0700) and record, in state
// starting. An empty name gets one from the id; a name a live session
// holds is refused.
func (s Store) Create(name string, spec Spec, idleS, maxS int) (*Record, error) {
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating the sessions directory: %w", err)
	}
	// Two starts that name the same session take turns.
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if name != "" {
		if err := CheckName(name); err != nil {
			return nil, err
		}
		for _, r := range s.List() {
			if (r.Live() || r.State == StatePaused) && r.Name == name {
				return nil, fmt.Errorf("session name %q is taken by %s: stop it or choose another name: %w", name, r.ID, errdefs.ErrAlreadyExists)
			}
		}
	}
	if idleS < 0 || maxS < 0 {
		return nil, fmt.Errorf("idle timeout and max lifetime must be positive seconds: %w", errdefs.ErrInvalidArgument)
	}
	var b [6]byte
	rand.Read(b[:])
	id := "ss-" + hex.EncodeToString(b[:])
	if name == "" {
		name = "s-" + id[3:9]
	}
	if err := os.Mkdir(s.SessionDir(id), 0o700); err != nil {
		return nil, fmt.Errorf("creating the session's directory: %w", err)
	}
	now := time.Now().UTC()
	r := &Record{ID: id, Name: name, State: StateStarting, Spec: spec, Created: now, LastUsed: now,
		IdleTimeoutS: cmpOr(idleS, DefaultIdleTimeoutS), MaxLifetimeS: cmpOr(maxS, DefaultMaxLifetimeS),
		Socket: s.Socket(id)}
	return r, s.Write(r)
}

// lock takes the sessions directory's lock until unlock.
func (s Store) lock() (unlock func(), err error) {
	return s.lockFile(filepath.Join(s.Dir(), ".lock"))
}

// lockFile takes the lock on the file at path until unlock.
func (s Store) lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the sessions directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the sessions directory: %w", err)
	}
	return func() { f.Close() }, nil
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Write writes r's session.json atomically, mode 0600.
func (s Store) Write(r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	dir := s.SessionDir(r.ID)
	tmp, err := os.CreateTemp(dir, ".session-*.json")
	if err != nil {
		return fmt.Errorf("writing the session record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the session record: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the session record: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, "session.json")); err != nil {
		return fmt.Errorf("writing the session record: %w", err)
	}
	return nil
}

// Read reads session id's record as written, with no liveness check.
func (s Store) Read(id string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(s.SessionDir(id), "session.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no session %s (see isopod session ls): %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the session record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading the session record %s: %w", id, err)
	}
	return &r, nil
}

// Load reads session id's record and marks it lost when it says live but
// its supervisor is gone.
func (s Store) Load(id string) (*Record, error) {
	r, err := s.Read(id)
	if err != nil {
		return nil, err
	}
	s.checkLive(r)
	return r, nil
}

// checkLive marks a live record whose supervisor is gone as lost, on
// disk too. A starting record with no supervisor yet is left alone for a
// minute: the CLI is still launching it.
func (s Store) checkLive(r *Record) {
	if !r.Live() {
		return
	}
	if r.SupervisorPID == 0 {
		if time.Since(r.Created) < time.Minute {
			return
		}
	} else if vmrecord.Alive(r.SupervisorPID, r.SupervisorStart) {
		return
	}
	// Read again: the supervisor may have written its final state since.
	if again, err := s.Read(r.ID); err == nil && !again.Live() {
		*r = *again
		return
	}
	r.State = StateLost
	r.Reason = fmt.Sprintf("its supervisor (pid %d) is gone: the VM went with it", r.SupervisorPID)
	if r.SupervisorPID == 0 {
		r.Reason = "its supervisor never started"
	}
	s.Write(r)
}

// List returns every session's record, oldest first, lost ones marked.
func (s Store) List() []*Record {
	ents, _ := os.ReadDir(s.Dir())
	var out []*Record
	for _, e := range ents {
		if !e.IsDir() || !idRE.MatchString(e.Name()) {
			continue
		}
		if r, err := s.Load(e.Name()); err == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Resolve finds the session an ID or NAME names: the id, else the live
// session of that name, else the newest of that name.
func (s Store) Resolve(ref string) (*Record, error) {
	if idRE.MatchString(ref) {
		return s.Load(ref)
	}
	var found *Record
	for _, r := range s.List() {
		if r.Name != ref {
			continue
		}
		if found == nil || r.Live() || !found.Live() {
			found = r
		}
	}
	if found == nil {
		return nil, fmt.Errorf("no session %q (see isopod session ls): %w", ref, errdefs.ErrNotFound)
	}
	return found, nil
}

// Prune removes the directories of the sessions that are over (stopped,
// or lost with their supervisor) and returns their ids. A live or paused
// session is kept.
func (s Store) Prune() []string {
	var removed []string
	for _, r := range s.List() {
		if r.Live() || r.State == StatePaused {
			continue
		}
		if err := os.RemoveAll(s.SessionDir(r.ID)); err == nil {
			removed = append(removed, r.ID)
		}
	}
	return removed
}
