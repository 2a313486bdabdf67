package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	"isopod/internal/agentproto"
)

// ExecRequest is one command for the guest.
type ExecRequest struct {
	agentproto.Exec
	// Stdin, when set, is streamed to the process and then closed; nil gives
	// the process /dev/null.
	Stdin io.Reader
	// Stdout and Stderr receive the output while it is produced.
	Stdout, Stderr io.Writer
}

// Exec runs a command and returns how it ended. ctx bounds the whole call; the
// guest enforces r.TimeoutMS itself, so give ctx a little more. A write error
// on Stdout or Stderr does not stop the exec; it is returned after it ends.
func (c *Client) Exec(ctx context.Context, r ExecRequest) (*agentproto.ExecDone, error) {
	id, q, err := c.register()
	if err != nil {
		return nil, err
	}
	defer c.unregister(id)
	ex := r.Exec
	ex.Stdin = r.Stdin != nil
	if err := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindExec, Exec: &ex}, nil); err != nil {
		return nil, err
	}

	// Stdin: at most StdinWindow frames unacknowledged.
	credits := make(chan struct{}, agentproto.StdinWindow)
	for range agentproto.StdinWindow {
		credits <- struct{}{}
	}
	stdinCtx, stopStdin := context.WithCancel(ctx)
	defer stopStdin()
	stdinErr := make(chan error, 1)
	if r.Stdin != nil {
		go func() { stdinErr <- c.pumpStdin(stdinCtx, id, r.Stdin, credits) }()
	} else {
		stdinErr <- nil
	}

	var writeErr error
	for {
		f, err := c.recv(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		switch f.msg.Kind {
		case agentproto.KindOutput:
			w := r.Stdout
			if f.msg.Stream == "stderr" {
				w = r.Stderr
			}
			if w != nil && writeErr == nil {
				if _, err := w.Write(f.payload); err != nil {
					writeErr = fmt.Errorf("writing %s: %w", f.msg.Stream, err)
				}
			}
		case agentproto.KindStdinAck:
			select {
			case credits <- struct{}{}:
			default:
			}
		case agentproto.KindExecDone:
			stopStdin()
			if err := <-stdinErr; err != nil && !errors.Is(err, context.Canceled) {
				c.log.Debug("stdin stopped early", "err", err)
			}
			if f.msg.Done == nil {
				return nil, fmt.Errorf("exec: guest sent exec_done without a body")
			}
			return f.msg.Done, writeErr
		case agentproto.KindError:
			return nil, fmt.Errorf("guest: exec: %s", f.msg.Error)
		}
	}
}

func (c *Client) pumpStdin(ctx context.Context, id uint64, r io.Reader, credits chan struct{}) error {
	buf := make([]byte, agentproto.ChunkSize)
	for {
		select {
		case <-credits:
		case <-ctx.Done():
			return ctx.Err()
		}
		n, err := r.Read(buf)
		if n > 0 {
			if serr := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindStdin}, buf[:n]); serr != nil {
				return serr
			}
		} else {
			credits <- struct{}{} // nothing sent; keep the credit
		}
		if err == io.EOF {
			return c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindStdin, EOF: true}, nil)
		}
		if err != nil {
			// Close the guest's stdin so the process sees EOF, and report.
			c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindStdin, EOF: true}, nil)
			return fmt.Errorf("reading stdin: %w", err)
		}
	}
}

// CopyOut streams the guest file at path into w. maxBytes > 0 makes the guest
// refuse a larger file. The returned FileDone is set only when the guest
// reported the file complete and every byte reached w.
func (c *Client) CopyOut(ctx context.Context, path string, maxBytes int64, w io.Writer) (*agentproto.FileDone, error) {
	id, q, err := c.register()
	if err != nil {
		return nil, err
	}
	defer c.unregister(id)
	if err := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindCopyOut, Path: path, MaxBytes: maxBytes}, nil); err != nil {
		return nil, err
	}
	var n int64
	for {
		f, err := c.recv(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("copy-out %s: %w", path, err)
		}
		switch f.msg.Kind {
		case agentproto.KindFileChunk:
			n += int64(len(f.payload))
			if maxBytes > 0 && n > maxBytes {
				return nil, fmt.Errorf("copy-out %s: guest sent more than %d bytes", path, maxBytes)
			}
			if _, err := w.Write(f.payload); err != nil {
				return nil, fmt.Errorf("copy-out %s: %w", path, err)
			}
		case agentproto.KindFileDone:
			if f.msg.File == nil || f.msg.File.Bytes != n {
				return nil, fmt.Errorf("copy-out %s: guest reported a different size than it sent (%d bytes received)", path, n)
			}
			return f.msg.File, nil
		case agentproto.KindError:
			return nil, fmt.Errorf("copy-out %s: guest: %s", path, f.msg.Error)
		}
	}
}
