package supervisor

import (
	"context"

	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// CommitReport is the answer to a commit call: the stage the session's
// filesystem was stored as, and where the commit's time went.
type CommitReport struct {
	OK        bool   `json:"ok"`
	SessionID string `json:"session_id"`
	sandbox.HeldCommit
}

// commit stores the session's filesystem as a stage labelled c.Label; the
// session keeps running.
func (s *sup) commit(ctx context.Context, c session.Call) (any, error) {
	hc, err := s.vm.Commit(ctx, c.Label)
	if err != nil {
		return nil, err
	}
	return CommitReport{OK: true, SessionID: s.o.ID, HeldCommit: hc}, nil
}
