package sandbox

import (
	"cmp"
	"context"
	"io"

	"isopod/internal/admission"
	"isopod/internal/agentclient"
	"isopod/internal/hostio"
)

// admit refuses, before any VM starts, everything about req that can be
// refused: it normalizes req, opens the workspace's host directory (once:
// the run copies what was checked), plans the run and checks the copy-out
// destinations a front end did not open. It returns the run's stdin, which
// the caller closes; the run closes the workspace directory it opened.
func (s *Service) admit(ctx context.Context, req Request) (_ Request, _ *plan, _ io.Reader, retErr error) {
	req, err := normalize(req, admission.ReadHost())
	if err != nil {
		return req, nil, nil, err
	}
	if req.creds, err = s.resolveCredentials(req); err != nil {
		return req, nil, nil, err
	}
	if err := req.Workspace.OpenHost(); err != nil {
		return req, nil, nil, err
	}
	defer func() {
		if retErr != nil {
			req.Workspace.Release()
		}
	}()
	pl, err := s.planRun(ctx, req)
	if err != nil {
		return req, nil, nil, err
	}
	if err := checkFrames(req, pl); err != nil {
		return req, nil, nil, err
	}
	for _, c := range req.CopyOut {
		// A destination given by its directory's descriptor was checked
		// by the caller, relative to it; its path may name another place.
		if c.HostDir != nil {
			continue
		}
		if err := (hostio.Operator{}).CheckCopyOut("copy-out", c.Host); err != nil {
			return req, nil, nil, err
		}
	}
	return req, pl, req.Stdin, nil
}

// checkFrames refuses a run whose command (argv, env and cwd, with the
// base image's env) the guest protocol cannot carry. The guest paths
// themselves were checked when req was normalised.
func checkFrames(req Request, pl *plan) error {
	argvField := "argv"
	if req.Shell {
		argvField = "cmd"
	}
	cwd := req.Cwd
	if req.Workspace != nil {
		cwd = cmp.Or(cwd, req.Workspace.Guest)
	}
	return agentclient.CheckExec(argvField, req.Argv, req.Env, cmp.Or(cwd, pl.cwd), pl.env)
}
