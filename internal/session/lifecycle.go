package session

import (
	"context"
	"fmt"

	"isopod/internal/errdefs"
)

// Summary is what start, resume and fork answer of a session.
type Summary struct {
	OK           bool     `json:"ok"`
	SessionID    string   `json:"session_id"`
	Name         string   `json:"name"`
	State        string   `json:"state"`
	VMID         string   `json:"vm_id,omitempty"`
	Path         string   `json:"path,omitempty"`
	GuestIP      string   `json:"guest_ip,omitempty"`
	IdleTimeoutS int      `json:"idle_timeout_s"`
	MaxLifetimeS int      `json:"max_lifetime_s"`
	Resumed      bool     `json:"resumed,omitempty"`
	Warnings     []string `json:"warnings,omitempty"`
}

// Summary is r as start, resume and fork answer it.
func (r *Record) Summary() Summary {
	return Summary{OK: true, SessionID: r.ID, Name: r.Name, State: r.State, VMID: r.VMID, Path: r.Path,
		GuestIP: r.GuestIP, IdleTimeoutS: r.IdleTimeoutS, MaxLifetimeS: r.MaxLifetimeS, Warnings: r.Warnings}
}

// Resume brings a paused session back: a new supervisor restores its VM
// from the pause snapshot, with its processes, files and jobs.
func (l Launcher) Resume(ctx context.Context, st Store, ref string) (*Record, error) {
	return nil, fmt.Errorf("resuming a session: %w", errdefs.ErrNotSupported)
}

// Wake resumes the session ref names when it is paused, and reports
// whether it did; a live session is left as it is.
func (l Launcher) Wake(ctx context.Context, st Store, ref string) (bool, error) {
	rec, err := st.Resolve(ref)
	if err != nil {
		return false, err
	}
	_ = rec
	return false, nil
}

// Fork makes a new session, named name (empty: from its id), with the
// memory, processes and files of the live or paused session ref names.
func (l Launcher) Fork(ctx context.Context, st Store, ref, name string) (*Record, error) {
	return nil, fmt.Errorf("forking a session: %w", errdefs.ErrNotSupported)
}
