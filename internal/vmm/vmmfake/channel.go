package vmmfake

import (
	"bytes"
	"fmt"
	"io"

	"isopod/internal/agentproto"
)

// channel is the agent channel as the fake guest's agent sees it: the guest
// end of the socket pair, read frame by frame so that OnRequest sees every
// request and a paused machine delivers nothing.
type channel struct {
	m *Machine
	// dropHello swallows the agent's first frame, its unsolicited Hello: a
	// restored guest sent it before the snapshot was taken.
	dropHello bool
	pending   bytes.Buffer // the current frame, re-encoded for the agent
}

// Read hands the agent the next frame the host sent.
func (c *channel) Read(p []byte) (int, error) {
	for c.pending.Len() == 0 {
		msg, payload, err := agentproto.ReadFrame(c.m.guest)
		if err != nil {
			if herr := c.m.holdIfPaused(); herr != nil {
				return 0, herr
			}
			return 0, err
		}
		if err := c.m.holdIfPaused(); err != nil {
			return 0, err
		}
		if hook := c.m.drv.cfg.OnRequest; hook != nil {
			hook(c.m, msg)
			if err := c.m.holdIfPaused(); err != nil {
				return 0, err // the hook crashed the guest
			}
		}
		if err := agentproto.WriteFrame(&c.pending, msg, payload); err != nil {
			return 0, err
		}
	}
	return c.pending.Read(p)
}

// Write sends one frame of the agent's (agentproto.WriteFrame writes each
// frame with one call) to the host.
func (c *channel) Write(p []byte) (int, error) {
	if err := c.m.holdIfPaused(); err != nil {
		return 0, err
	}
	if c.dropHello {
		c.dropHello = false
		msg, _, err := agentproto.ReadFrame(bytes.NewReader(p))
		if err != nil {
			return 0, fmt.Errorf("vmmfake: the agent's first frame: %w", err)
		}
		if msg.ID == 0 && msg.Kind == agentproto.KindHello {
			return len(p), nil
		}
	}
	return c.m.guest.Write(p)
}

var _ io.ReadWriter = (*channel)(nil)
