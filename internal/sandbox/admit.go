package sandbox

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"isopod/internal/errdefs"
)

// admit refuses, before any VM starts, everything about req that can be
// refused: it normalizes req, plans the run, opens its stdin (the caller
// closes it) and checks the copy-out destinations.
func (s *Service) admit(ctx context.Context, req Request) (Request, *plan, io.Reader, error) {
	req, err := normalize(req, readHostLimits())
	if err != nil {
		return req, nil, nil, err
	}
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
		if err := checkDestination(c.Host); err != nil {
			return req, nil, nil, err
		}
	}
	stdin, err := openStdin(req)
	if err != nil {
		return req, nil, nil, err
	}
	return req, pl, stdin, nil
}

func openStdin(req Request) (io.Reader, error) {
	if req.Stdin != nil {
		return req.Stdin, nil
	}
	if req.StdinFile == "" {
		return nil, nil
	}
	// A FIFO or a device could block the open itself, before any timeout
	// applies: only regular files are read (- feeds isopod's own stdin).
	if st, err := os.Stat(req.StdinFile); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("--stdin-file %s: %s, not a regular file; pipe it in with --stdin-file - instead: %w",
			req.StdinFile, fileKind(st.Mode()), errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(req.StdinFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("--stdin-file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("--stdin-file %s: not a regular file; pipe it in with --stdin-file - instead: %w", req.StdinFile, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// fileKind names a non-regular file's type for a refusal.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}
