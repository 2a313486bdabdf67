package sandbox

import (
	"context"
	"os"
	"slices"
	"testing"

	"isopod/internal/session"
	"isopod/internal/vmrecord"
)

// gc removes a lost session's directory and keeps a live one's.
func TestGCRemovesLostSessions(t *testing.T) {
	s := newTestService(t)
	st := session.Store{Paths: s.opts.Paths}
	lost, err := st.Create("lost", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost.State = session.StateRunning
	lost.SupervisorPID, lost.SupervisorStart = deadPID(t)
	if err := st.Write(lost); err != nil {
		t.Fatal(err)
	}
	live, err := st.Create("live", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	live.State = session.StateRunning
	live.SupervisorPID = os.Getpid()
	live.SupervisorStart = vmrecord.ProcStartTime(os.Getpid())
	if err := st.Write(live); err != nil {
		t.Fatal(err)
	}
	res, err := s.VMGC(context.Background(), 20)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.SessionsRemoved, []string{lost.ID}) {
		t.Errorf("sessions removed %v; want only %s", res.SessionsRemoved, lost.ID)
	}
	if _, err := os.Stat(st.SessionDir(lost.ID)); !os.IsNotExist(err) {
		t.Errorf("the lost session's directory: %v; want it gone", err)
	}
	if _, err := os.Stat(st.SessionDir(live.ID)); err != nil {
		t.Errorf("the live session's directory: %v", err)
	}
}
