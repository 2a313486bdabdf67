package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"isopod/internal/errdefs"
)

// Summary is what start, resume and fork answer of a session.
type Summary struct {
	OK           bool   `json:"ok"`
	SessionID    string `json:"session_id"`
	Name         string `json:"name"`
	State        string `json:"state"`
	VMID         string `json:"vm_id,omitempty"`
	Path         string `json:"path,omitempty"`
	GuestIP      string `json:"guest_ip,omitempty"`
	IdleTimeoutS int    `json:"idle_timeout_s"`
	MaxLifetimeS int    `json:"max_lifetime_s"`
	Resumed      bool   `json:"resumed,omitempty"`
	ResumeMS     *int64 `json:"resume_ms,omitempty"`
	// ResumeTotalMS is the whole resume or fork, ResumeMS its restore and
	// the guest's hello.
	ResumeTotalMS int64    `json:"resume_total_ms,omitempty"`
	Warnings      []string `json:"warnings,omitempty"`
}

// Summary is r as start, resume and fork answer it: resumed, with the
// resume's time, when its VM came from a pause snapshot.
func (r *Record) Summary() Summary {
	var resumeMS *int64
	if r.ResumeMS > 0 || r.ResumeTotalMS > 0 {
		ms := r.ResumeMS
		resumeMS = &ms
	}
	return Summary{OK: true, Resumed: resumeMS != nil, ResumeMS: resumeMS, ResumeTotalMS: r.ResumeTotalMS, SessionID: r.ID, Name: r.Name, State: r.State, VMID: r.VMID, Path: r.Path,
		GuestIP: r.GuestIP, IdleTimeoutS: r.IdleTimeoutS, MaxLifetimeS: r.MaxLifetimeS, Warnings: r.Warnings}
}

// Resume brings a paused session back: a new supervisor restores its VM
// from the pause snapshot, with its processes, files and jobs. A session
// that is live already is returned as it is; one that is neither is
// failed_precondition. Two resumes of one session take turns: the second
// finds it running.
func (l Launcher) Resume(ctx context.Context, st Store, ref string) (*Record, error) {
	rec, _, err := l.resume(ctx, st, ref)
	return rec, err
}

// resume is Resume, reporting whether it resumed the session.
func (l Launcher) resume(ctx context.Context, st Store, ref string) (*Record, bool, error) {
	rec, err := st.Resolve(ref)
	if err != nil {
		return nil, false, err
	}
	unlock, err := st.lockFile(filepath.Join(st.SessionDir(rec.ID), ".resume.lock"))
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if rec, err = st.Load(rec.ID); err != nil {
		return nil, false, err
	}
	switch {
	case rec.Live():
		return rec, false, nil
	case rec.State != StatePaused:
		return nil, false, fmt.Errorf("session %s is %s (%s), not paused: start a new one: %w",
			rec.ID, rec.State, rec.Reason, errdefs.ErrFailedPrecondition)
	}
	if err := l.Launch(ctx, st, rec, "--resume"); err != nil {
		return nil, false, err
	}
	rec, err = st.Load(rec.ID)
	return rec, err == nil, err
}

// Wake resumes the session ref names when it is paused, and reports
// whether it did; a live session is left as it is.
func (l Launcher) Wake(ctx context.Context, st Store, ref string) (bool, error) {
	rec, err := st.Resolve(ref)
	if err != nil {
		return false, err
	}
	if rec.State != StatePaused {
		return false, nil
	}
	_, resumed, err := l.resume(ctx, st, rec.ID)
	return resumed, err
}

// CallWake sends c to the session ref names as Store.Call does, resuming
// it first when it is paused, and reports whether it resumed it. A call
// turned away because the session was pausing (unavailable) is sent
// again once the pause is done and the session resumed.
func (l Launcher) CallWake(ctx context.Context, st Store, ref string, c Call, d time.Duration) (json.RawMessage, bool, error) {
	resumed, err := l.Wake(ctx, st, ref)
	if err != nil {
		return nil, false, err
	}
	res, err := st.Call(ctx, ref, c, d)
	if !errors.Is(err, errdefs.ErrUnavailable) || c.Op == OpStop {
		return res, resumed, err
	}
	if rec, rerr := st.Resolve(ref); rerr == nil && rec.Live() {
		WaitExit(rec, pauseWait)
	}
	if woke, werr := l.Wake(ctx, st, ref); werr != nil || !woke {
		return nil, resumed, err
	}
	res, err = st.Call(ctx, ref, c, d)
	return res, true, err
}

// pauseWait bounds CallWake's wait for a pausing session's supervisor.
const pauseWait = 30 * time.Second

// Fork makes a new session, named name (empty: from its id), with the
// memory, processes and files of the live or paused session ref names:
// the new session's supervisor copies the parent's pause, or has the
// parent's supervisor snapshot its running VM (which runs on), and
// resumes the copy. It returns the new session's record.
func (l Launcher) Fork(ctx context.Context, st Store, ref, name string) (*Record, error) {
	parent, err := st.Resolve(ref)
	if err != nil {
		return nil, err
	}
	// A paused parent is not resumed while it is copied.
	unlock, err := st.lockFile(filepath.Join(st.SessionDir(parent.ID), ".resume.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if parent, err = st.Load(parent.ID); err != nil {
		return nil, err
	}
	if !parent.Live() && parent.State != StatePaused {
		return nil, fmt.Errorf("session %s is %s (%s): only a running or paused session forks: %w",
			parent.ID, parent.State, parent.Reason, errdefs.ErrFailedPrecondition)
	}
	child, err := st.Create(name, parent.Spec, parent.IdleTimeoutS, parent.MaxLifetimeS)
	if err != nil {
		return nil, err
	}
	child.IdleAction = parent.IdleAction
	if err := st.Write(child); err != nil {
		return nil, err
	}
	if err := l.Launch(ctx, st, child, "--resume", "--fork-from", parent.ID); err != nil {
		return nil, err
	}
	return st.Load(child.ID)
}

// CapLifetime is the maximum lifetime a start gets under a host's cap
// limit (0: none), named by setting: a lifetime the caller asked for
// (given, under field) over the cap is refused; the default is lowered to
// it.
func CapLifetime(maxS int, given bool, limit int, field, setting string) (int, error) {
	if maxS <= 0 {
		maxS = DefaultMaxLifetimeS
	}
	if limit <= 0 || maxS <= limit {
		return maxS, nil
	}
	if !given {
		return limit, nil
	}
	return 0, fmt.Errorf("%s %d is over this host's cap of %d s (%s): ask for less, or raise the setting: %w",
		field, maxS, limit, setting, errdefs.ErrInvalidArgument)
}
