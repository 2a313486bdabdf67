package supervisor

import (
	"context"
	"fmt"
	"os"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// A fork's supervisor (Options.ForkFrom) fills its own pause directory
// with a copy of the parent's VM before it resumes from there like any
// resume: from the parent's pause when the parent is paused (the
// launcher keeps it from resuming meanwhile), else through a fork call to
// the parent's supervisor, which snapshots its running VM into the
// directory and lets it run on.

// forkTimeout bounds a fork call: the snapshot and the copies.
const forkTimeout = pauseTimeout

// forkFrom fills dir, this session's pause directory, with a copy of the
// parent's VM.
func (s *sup) forkFrom(ctx context.Context, dir string) error {
	parent, err := s.o.Store.Load(s.o.ForkFrom)
	if err != nil {
		return err
	}
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("forking: %w", err)
	}
	switch {
	case parent.State == session.StatePaused:
		return forkPaused(s.o.Store.Paths, s.o.Store.PauseDir(parent.ID), dir)
	case parent.Live():
		fctx, cancel := context.WithTimeout(ctx, forkTimeout)
		defer cancel()
		_, err := session.Dial(fctx, parent.Socket, session.Call{Op: session.OpFork, Child: s.o.ID})
		return err
	}
	return fmt.Errorf("session %s is %s: only a running or paused session forks: %w", parent.ID, parent.State, errdefs.ErrFailedPrecondition)
}

// resumeFork fills dir with a copy of the parent's VM (forkFrom) while
// the resume is admitted, then resumes the copy.
func (s *sup) resumeFork(ctx context.Context, dir string) (*sandbox.Held, error) {
	type admitted struct {
		a   *sandbox.Resuming
		err error
	}
	ch := make(chan admitted, 1)
	go func() {
		a, err := s.o.Service.AdmitResume(ctx, s.o.Request)
		ch <- admitted{a, err}
	}()
	err := s.forkFrom(ctx, dir)
	ad := <-ch
	if err != nil {
		return nil, err
	}
	if ad.err != nil {
		return nil, ad.err
	}
	return ad.a.Resume(ctx, dir)
}

// forkCall snapshots the running VM into the pause directory of the fork
// c names, which its supervisor made, and lets the VM run on.
func (s *sup) forkCall(ctx context.Context, c session.Call) (any, error) {
	if !session.ValidID(c.Child) || c.Child == s.o.ID {
		return nil, fmt.Errorf("fork: %q is not another session's id: %w", c.Child, errdefs.ErrInvalidArgument)
	}
	child, err := s.o.Store.Read(c.Child)
	if err != nil {
		return nil, err
	}
	if child.State != session.StateStarting {
		return nil, fmt.Errorf("fork: session %s is %s, not a fork being started: %w", child.ID, child.State, errdefs.ErrFailedPrecondition)
	}
	dir := s.o.Store.PauseDir(child.ID)
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		return nil, fmt.Errorf("fork: session %s's pause directory is not new and empty: %w", child.ID, errdefs.ErrFailedPrecondition)
	}
	if err := s.vm.Fork(ctx, s.o.Store.Paths, dir); err != nil {
		return nil, err
	}
	return session.Reply{OK: true, SessionID: s.o.ID}, nil
}
