package vmmfake

import (
	"errors"
	"sync"
	"time"

	"isopod/internal/agent"
	"isopod/internal/agentproto"
)

// State is what a fake guest's machine operations did: the agent asked its
// [agent.System], which only records.
type State struct {
	// Hostname is the last one set; a cold boot starts with the command
	// line's isopod.hostname.
	Hostname string `json:"hostname,omitempty"`
	// Clock is the last wall clock the host sent (zero: none).
	Clock time.Time `json:"clock"`
	// Net is the last network configuration applied (nil: none).
	Net *agentproto.NetConfig `json:"net,omitempty"`
	// EntropyBytes counts the random bytes the host added, EntropyCalls
	// the requests.
	EntropyBytes int `json:"entropy_bytes"`
	EntropyCalls int `json:"entropy_calls"`
	// LastSeed is the last entropy the host added (not kept in snapshots).
	LastSeed []byte `json:"-"`
	// BootID is the last boot id the host set ("": the boot's own).
	BootID string `json:"boot_id,omitempty"`
	// Syncs counts disk syncs (a Halt with Sync).
	Syncs int `json:"syncs"`
	// Mount is the root the host asked for (nil: not yet).
	Mount *agentproto.Mount `json:"mount,omitempty"`
	// Freezes and Thaws count the scratch filesystem's freezes and thaws;
	// Frozen says one holds now.
	Freezes int  `json:"freezes"`
	Thaws   int  `json:"thaws"`
	Frozen  bool `json:"frozen"`
}

var errAlreadyMounted = errors.New("mount: the root is already assembled")

// System is the fake guest's agent.System: it only records, in a State.
// Tests of the agent protocol outside a fake machine use one through
// [NewSystem].
type System struct {
	mu sync.Mutex // guards following
	st State
}

var _ agent.System = (*System)(nil)

// NewSystem returns a System that has recorded nothing.
func NewSystem() *System { return newSystem(State{}, "") }

// newSystem starts from a snapshot's state, or a cold boot's command line.
func newSystem(from State, cmdline string) *System {
	s := &System{st: from}
	if s.st.Hostname == "" {
		s.st.Hostname = cmdlineValue(cmdline, agentproto.CmdlineHostname)
	}
	if s.st.Net != nil {
		n := *s.st.Net
		s.st.Net = &n
	}
	return s
}

// State returns a copy of what the system recorded.
func (s *System) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st.Net != nil {
		n := *st.Net
		n.DNS = append([]string(nil), n.DNS...)
		n.Env = append([]string(nil), n.Env...)
		st.Net = &n
	}
	st.LastSeed = append([]byte(nil), st.LastSeed...)
	return st
}

func (s *System) SetHostname(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Hostname = name
	return nil
}

func (s *System) SetClock(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Clock = t
	return nil
}

func (s *System) ConfigureNet(cfg agentproto.NetConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Net = &cfg
	return nil
}

func (s *System) AddEntropy(seed []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.EntropyBytes += len(seed)
	s.st.LastSeed = append([]byte(nil), seed...)
	s.st.EntropyCalls++
	return nil
}

func (s *System) SetBootID(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.BootID = id
	return nil
}

func (s *System) SyncDisks() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Syncs++
	return nil
}

func (s *System) MountRoot(m agentproto.Mount) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Mount != nil {
		return errAlreadyMounted
	}
	s.st.Mount = &m
	return nil
}

var errFrozen = errors.New("freeze: the scratch filesystem is already frozen")

// FreezeScratch records a freeze; the fake guest's files are the host's,
// so nothing blocks.
func (s *System) FreezeScratch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Frozen {
		return errFrozen
	}
	s.st.Frozen = true
	s.st.Freezes++
	return nil
}

// ThawScratch records a thaw.
func (s *System) ThawScratch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.st.Frozen {
		return errors.New("thaw: the scratch filesystem is not frozen")
	}
	s.st.Frozen = false
	s.st.Thaws++
	return nil
}

// WorkspaceLayers: the fake guest has no filesystem of its own, so no
// workspace layers to read.
func (s *System) WorkspaceLayers() (upper, lower string) { return "", "" }
