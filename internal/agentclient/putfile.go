package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"isopod/internal/agentproto"
)

// PutFile copies what r yields into the guest file at path, with mode's
// permission bits (0: 0644), making missing parent directories. The guest
// writes a temporary file beside path and renames it there once complete,
// so path never holds a partial file; it refuses a path that is a
// directory or another non-regular file. More than maxBytes bytes
// (maxBytes > 0) fail the copy, as do a read error of r and the end of
// ctx; each leaves nothing at path (the guest has removed its temporary
// file when PutFile returns, unless it does not answer within abortWait).
// It returns the bytes written.
func (c *Client) PutFile(ctx context.Context, path string, mode fs.FileMode, maxBytes int64, r io.Reader) (int64, error) {
	id, q, err := c.register()
	if err != nil {
		return 0, err
	}
	defer c.unregister(id)
	m := &agentproto.Msg{ID: id, Kind: agentproto.KindPutFile, Path: path, MaxBytes: maxBytes, Put: &agentproto.PutFile{Mode: uint32(mode.Perm())}}
	if err := c.send(m, nil); err != nil {
		return 0, err
	}
	if maxBytes > 0 {
		// One byte over the limit is enough for the guest to refuse it.
		r = io.LimitReader(r, maxBytes+1)
	}
	abort := func() { c.abortPut(id, q) }
	buf := make([]byte, agentproto.ChunkSize)
	var off int64
	inflight, eof := 0, false
	for !eof || inflight > 0 {
		if err := ctx.Err(); err != nil {
			abort()
			return 0, fmt.Errorf("put %s: %w", path, err)
		}
		if !eof && inflight < agentproto.PutWindow {
			n, rerr := io.ReadFull(r, buf)
			eof = rerr != nil
			if eof && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
				abort()
				return 0, fmt.Errorf("put %s: reading the source: %w", path, rerr)
			}
			if err := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindFileChunk, Offset: off, EOF: eof}, buf[:n]); err != nil {
				return 0, err
			}
			off += int64(n)
			inflight++
			continue
		}
		f, err := c.recv(ctx, q)
		if err != nil {
			abort()
			return 0, fmt.Errorf("put %s: %w", path, err)
		}
		switch f.msg.Kind {
		case agentproto.KindFileAck:
			inflight--
		case agentproto.KindError:
			return 0, replyErr("put "+path+": guest: ", f.msg)
		case agentproto.KindFileDone:
			return 0, fmt.Errorf("put %s: guest finished before the last chunk", path)
		}
	}
	return c.putDone(ctx, q, path, off)
}

// abortWait bounds how long an abandoned copy-in waits for the guest to
// remove its temporary file.
const abortWait = 2 * time.Second

// abortPut tells the guest to give a copy-in up and waits (briefly) for
// its answer, so that the temporary file is gone when PutFile returns.
func (c *Client) abortPut(id uint64, q *queue) {
	if c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindFileChunk, Abort: true}, nil) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortWait)
	defer cancel()
	for {
		f, err := c.recv(ctx, q)
		if err != nil || f.msg.Kind == agentproto.KindError || f.msg.Kind == agentproto.KindFileDone {
			return
		}
	}
}

// putDone waits for the guest's verdict once every chunk is acknowledged.
func (c *Client) putDone(ctx context.Context, q *queue, path string, sent int64) (int64, error) {
	for {
		f, err := c.recv(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("put %s: %w", path, err)
		}
		switch f.msg.Kind {
		case agentproto.KindError:
			return 0, replyErr("put "+path+": guest: ", f.msg)
		case agentproto.KindFileDone:
			if f.msg.File == nil || f.msg.File.Bytes != sent {
				return 0, fmt.Errorf("put %s: guest reported another size than the %d bytes sent", path, sent)
			}
			return sent, nil
		}
	}
}
