package agentclient

import (
	"context"
	"fmt"

	"isopod/internal/agentproto"
)

// WorkspaceChanges asks the guest what differs in the run's workspace and
// calls fn for each entry, in the order the guest sends them. Entries are
// untrusted: fn checks them. More than max entries (max > 0) end the call
// with an error, as does an error from fn (returned as it is).
func (c *Client) WorkspaceChanges(ctx context.Context, max int, fn func(agentproto.WorkspaceEntry) error) error {
	id, q, err := c.register()
	if err != nil {
		return err
	}
	defer c.unregister(id)
	if err := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindWorkspaceChanges}, nil); err != nil {
		return err
	}
	n := 0
	for {
		f, err := c.recv(ctx, q)
		if err != nil {
			return fmt.Errorf("workspace changes: %w", err)
		}
		switch f.msg.Kind {
		case agentproto.KindWorkspaceEntry:
			if f.msg.Entry == nil {
				return fmt.Errorf("workspace changes: guest sent an entry without a body")
			}
			if n++; max > 0 && n > max {
				return fmt.Errorf("workspace changes: guest listed more than %d changed paths", max)
			}
			if err := fn(*f.msg.Entry); err != nil {
				return err
			}
		case agentproto.KindOK:
			return nil
		case agentproto.KindError:
			return replyErr("workspace changes: guest: ", f.msg)
		}
	}
}
