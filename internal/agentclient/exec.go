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
			// The process is gone: stop feeding it without waiting for the
			// reader, which may block for ever (a terminal, an idle pipe);
			// the pump ends at its next read or when its reader closes.
			stopStdin()
			select {
			case err := <-stdinErr:
				if err != nil && !errors.Is(err, context.Canceled) {
					c.log.Debug("stdin stopped early", "err", err)
				}
			default:
			}
			if f.msg.Done == nil {
				return nil, fmt.Errorf("exec: guest sent exec_done without a body")
			}
			return f.msg.Done, writeErr
		case agentproto.KindError:
			return nil, replyErr("guest: exec: ", f.msg)
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

// CopyLimits bound one copy-out.
type CopyLimits struct {
	// MaxSize is the largest file size accepted; 0 means no limit.
	MaxSize int64
	// MaxData is the most data bytes the guest may send (a sparse file's
	// holes and runs of zeros are not sent); NoLimit means no limit, 0
	// allows a file with no data only.
	MaxData int64
}

// NoLimit is CopyLimits.MaxData without a limit.
const NoLimit = -1

// CopyOut writes the data of the guest file at path into w, each chunk at
// its offset; the bytes in between (holes, zeros) are not written, so the
// caller makes the destination sparse and sets its size to FileDone.Bytes.
// The returned FileDone is set only when the guest reported the file
// complete and every byte reached w.
func (c *Client) CopyOut(ctx context.Context, path string, lim CopyLimits, w io.WriterAt) (*agentproto.FileDone, error) {
	id, q, err := c.register()
	if err != nil {
		return nil, err
	}
	defer c.unregister(id)
	m := &agentproto.Msg{ID: id, Kind: agentproto.KindCopyOut, Path: path, MaxBytes: lim.MaxSize}
	if lim.MaxData >= 0 {
		m.MaxData = &lim.MaxData
	}
	if err := c.send(m, nil); err != nil {
		return nil, err
	}
	var data, end int64
	for {
		f, err := c.recv(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("copy-out %s: %w", path, err)
		}
		switch f.msg.Kind {
		case agentproto.KindFileChunk:
			off, n := f.msg.Offset, int64(len(f.payload))
			data += n
			switch {
			case off < 0 || (lim.MaxSize > 0 && off+n > lim.MaxSize):
				return nil, fmt.Errorf("copy-out %s: guest sent bytes at %d, past the %d-byte limit", path, off+n, lim.MaxSize)
			case lim.MaxData >= 0 && data > lim.MaxData:
				return nil, fmt.Errorf("copy-out %s: guest sent more than %d bytes of data", path, lim.MaxData)
			}
			if _, err := w.WriteAt(f.payload, off); err != nil {
				return nil, fmt.Errorf("copy-out %s: %w", path, err)
			}
			end = max(end, off+n)
		case agentproto.KindFileDone:
			if f.msg.File == nil || f.msg.File.Data != data || end > f.msg.File.Bytes {
				return nil, fmt.Errorf("copy-out %s: guest reported a different file than it sent (%d bytes of data received, up to offset %d)", path, data, end)
			}
			if lim.MaxSize > 0 && f.msg.File.Bytes > lim.MaxSize {
				return nil, fmt.Errorf("copy-out %s: guest reported %d bytes, past the %d-byte limit", path, f.msg.File.Bytes, lim.MaxSize)
			}
			return f.msg.File, nil
		case agentproto.KindError:
			return nil, replyErr("copy-out "+path+": guest: ", f.msg)
		}
	}
}
