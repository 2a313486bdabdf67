//go:build linux

// Package jailchild is the inside of the VMM jail: the helper process that
// isopod starts in fresh namespaces sets the jail's root up, drops every
// privilege and executes the VMM in its own place (see package jail, the
// parent side).
//
// The helper is normally the small isopod-jail program (cmd/isopod-jail),
// which starts in a few milliseconds; any program that imports package
// jail can serve as its own helper too. This package therefore imports
// only the standard library and golang.org/x/sys/unix.
package jailchild

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Env carries the JSON-encoded Spec to the helper; a process started with
// it set is the helper.
const Env = "_ISOPOD_JAIL_CHILD"

// Version is the protocol between the parent and the helper. A helper
// refuses a spec of another version, so that a helper left from another
// build fails with a reason rather than building a different jail. It is
// a variable so that tests can build a helper of another version.
var Version = "3"

// Spec is what the helper needs.
type Spec struct {
	Version string   `json:"version"`
	Path    string   `json:"path"`
	Argv    []string `json:"argv"`
	Binds   []Bind   `json:"binds"`
	// SyncFD is a socket on which, once the parent is done, one byte
	// arrives with the status pipe's write end: the helper's pid, then
	// why it failed, go there, and the VMM's exec closes it. It is handed
	// over then, not inherited, so that only the helper holds it (unshare,
	// the helper's parent with subordinate ids, would keep an inherited
	// copy open, and the parent would never see the exec). Its name and
	// meaning stay the same across versions, so that even a helper that
	// refuses the spec can say why where the parent reads it.
	SyncFD  int      `json:"sync_fd"`
	ExeFD   int      `json:"exe_fd"` // the helper's own binary, closed before the VMM runs
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// Tasks are v1 cgroups' tasks files the helper's thread (the one that
	// executes the VMM) joins by writing 0, before anything else.
	Tasks []string `json:"tasks,omitempty"`
}

// Bind is one path made visible inside: Src on the host (symlinks
// resolved), At inside; Dev for a device node, which stays writable.
type Bind struct {
	Src string `json:"src"`
	At  string `json:"at"`
	Dev bool   `json:"dev,omitempty"`
}

// Rlimit caps a resource (soft and hard) where no cgroup can be had.
type Rlimit struct {
	Resource int    `json:"resource"`
	Max      uint64 `json:"max"`
}

// Encode returns s, stamped with this build's Version, as the value of
// Env.
func Encode(s Spec) (string, error) {
	s.Version = Version
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encoding the jail spec: %w", err)
	}
	return string(b), nil
}

// syncFD reads only the sync socket's number from an encoded spec, which
// every version carries the same way; -1 if there is none.
func syncFD(v string) int {
	var h struct {
		SyncFD *int `json:"sync_fd"`
	}
	if json.Unmarshal([]byte(v), &h) != nil || h.SyncFD == nil || *h.SyncFD < 3 {
		return -1
	}
	return *h.SyncFD
}

// Decode parses an encoded spec and refuses one of another version or with
// fields this build does not know: self names the helper in the message.
func Decode(v, self string) (*Spec, error) {
	stale := func(why string) error {
		return fmt.Errorf("the jail helper %s is from another isopod build (%s); reinstall isopod", self, why)
	}
	var h struct {
		Version string `json:"version"`
	}
	// Unmarshal, unlike the decoder below, also refuses trailing data.
	if err := json.Unmarshal([]byte(v), &h); err != nil {
		return nil, fmt.Errorf("the jail helper %s got a spec it cannot read: %w", self, err)
	}
	if h.Version != Version {
		return nil, stale(fmt.Sprintf("spec version %q, helper version %q", h.Version, Version))
	}
	var s Spec
	dec := json.NewDecoder(bytes.NewReader([]byte(v)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, stale(err.Error())
	}
	return &s, nil
}

// self is the helper's own path, for messages.
func self() string {
	if p, err := os.Executable(); err == nil {
		return p
	}
	return "isopod-jail"
}
