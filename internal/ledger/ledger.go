// Package ledger is the host-wide record of the VM places every isopod
// process holds under one state root: a CLI run, a session's supervisor,
// an MCP server (its runs, ready VMs and snapshot builds). Each holder
// process keeps one file in the ledger's directory saying what it holds;
// every change is read-modify-written under one lock file, so that a
// process deciding whether a VM fits sees what all the others hold at
// that moment. A holder is a process id and its start time (field 22 of
// /proc/PID/stat), so that a reused pid is not taken for it: the entries
// of processes that are gone are ignored and removed.
//
// The ledger keeps the record only; internal/admission decides with it.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

// Kind is what a place is held for.
type Kind string

const (
	KindRun     Kind = "run"     // a run's VM (CLI or MCP)
	KindSession Kind = "session" // a running session's VM
	KindReady   Kind = "ready"   // a paused VM kept ready for a run
	KindBuild   Kind = "build"   // a snapshot build
)

// Item is one place held: a VM of Kind costing CostMiB (guest memory
// plus its VMM's allowance).
type Item struct {
	Kind    Kind   `json:"kind"`
	CostMiB int    `json:"cost_mib"`
	ID      string `json:"id,omitempty"`
}

// Entry is what one holder process holds. Waiting counts the calls it has
// waiting for a place, which background VMs of other processes give way
// to.
type Entry struct {
	PID     int       `json:"pid"`
	Start   uint64    `json:"start"`
	Label   string    `json:"label,omitempty"`
	Items   []Item    `json:"items"`
	Waiting int       `json:"waiting,omitempty"`
	Updated time.Time `json:"updated"`
}

// Usage sums what entries hold.
type Usage struct {
	Places  int `json:"places"`
	CostMiB int `json:"cost_mib"`
	// Waiting counts the calls waiting for a place.
	Waiting int `json:"waiting,omitempty"`
}

// Sum adds up what entries hold.
func Sum(entries []Entry) Usage {
	var u Usage
	for _, e := range entries {
		u.Places += len(e.Items)
		for _, it := range e.Items {
			u.CostMiB += it.CostMiB
		}
		u.Waiting += e.Waiting
	}
	return u
}

// Holder is who a Ledger handle writes for.
type Holder struct {
	PID   int
	Start uint64
	// Key names the holder's file; empty: PID-Start. Two handles of one
	// process with different keys are two holders (tests).
	Key   string
	Label string
}

// Self is the running process as a holder, labelled label.
func Self(label string) Holder {
	pid := os.Getpid()
	return Holder{PID: pid, Start: ProcStart(pid), Label: label}
}

// Ledger is one holder's handle on the ledger in a directory. Its methods
// are safe for concurrent use.
type Ledger struct {
	dir  string
	self Holder
	lock *flock.Flock

	mu sync.Mutex // serialises this handle's transactions
}

// Open returns h's handle on the ledger in dir, creating the directory.
func Open(dir string, h Holder) (*Ledger, error) {
	if h.PID <= 0 || h.Start == 0 {
		return nil, fmt.Errorf("ledger: holder pid %d has no start time", h.PID)
	}
	if h.Key == "" {
		h.Key = fmt.Sprintf("%d-%d", h.PID, h.Start)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the ledger: %w", err)
	}
	return &Ledger{dir: dir, self: h, lock: flock.New(filepath.Join(dir, ".lock"))}, nil
}

// Dir is the ledger's directory.
func (l *Ledger) Dir() string { return l.dir }

// Tx is one transaction on the ledger: the others' entries as read under
// the lock, and what this holder will hold once it commits.
type Tx struct {
	l      *Ledger
	Others []Entry
}

// Begin takes the ledger's lock and reads the other live holders'
// entries, removing those of processes that are gone. The caller must
// Commit or Abort.
func (l *Ledger) Begin() (*Tx, error) {
	l.mu.Lock()
	if err := l.lock.Lock(); err != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("locking the ledger: %w", err)
	}
	others, err := l.readLocked(true)
	if err != nil {
		l.lock.Unlock()
		l.mu.Unlock()
		return nil, err
	}
	return &Tx{l: l, Others: others}, nil
}

// Commit records that this holder holds items with waiting calls (none
// and no waiting: its entry is removed) and releases the lock.
func (tx *Tx) Commit(items []Item, waiting int) error {
	l := tx.l
	defer l.mu.Unlock()
	defer l.lock.Unlock()
	path := l.path(l.self.Key)
	if len(items) == 0 && waiting == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("clearing the ledger entry: %w", err)
		}
		return nil
	}
	e := Entry{PID: l.self.PID, Start: l.self.Start, Label: l.self.Label, Items: items, Waiting: waiting, Updated: time.Now().UTC()}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the ledger entry: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing the ledger entry: %w", err)
	}
	return nil
}

// Abort releases the lock, changing nothing.
func (tx *Tx) Abort() {
	tx.l.lock.Unlock()
	tx.l.mu.Unlock()
}

// Clear removes this holder's entry.
func (l *Ledger) Clear() error {
	tx, err := l.Begin()
	if err != nil {
		return err
	}
	return tx.Commit(nil, 0)
}

// Entries returns every live holder's entry, this one's included.
func (l *Ledger) Entries() ([]Entry, error) {
	return Read(l.dir)
}

// Read returns the live holders' entries in the ledger in dir, without
// removing anything: for listings (isopod vm ls, doctor).
func Read(dir string) ([]Entry, error) {
	l := &Ledger{dir: dir, lock: flock.New(filepath.Join(dir, ".lock"))}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err := l.lock.RLock(); err != nil {
		return nil, fmt.Errorf("locking the ledger: %w", err)
	}
	defer l.lock.Unlock()
	return l.readLocked(false)
}

func (l *Ledger) path(key string) string { return filepath.Join(l.dir, key+".json") }

// readLocked reads the live entries other than this holder's (every one
// for a reader without a holder); with prune, the files of dead holders
// and unreadable files are removed.
func (l *Ledger) readLocked(prune bool) ([]Entry, error) {
	des, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	var out []Entry
	for _, de := range des {
		if prune && strings.HasSuffix(de.Name(), ".tmp") {
			// Written under the lock: one seen now was left by a holder
			// that died writing it.
			os.Remove(filepath.Join(l.dir, de.Name()))
			continue
		}
		key, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || (l.self.Key != "" && key == l.self.Key) {
			continue
		}
		p := filepath.Join(l.dir, de.Name())
		var e Entry
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &e)
		}
		if err != nil || !Alive(e.PID, e.Start) {
			if prune {
				os.Remove(p)
			}
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// ProcStart is field 22 of /proc/PID/stat (the start time in clock ticks
// since boot), or 0 when the process is gone or a zombie.
func ProcStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// Alive reports whether pid is still the process that started at start.
func Alive(pid int, start uint64) bool {
	return pid > 0 && start != 0 && ProcStart(pid) == start
}
