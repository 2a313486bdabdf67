package agentclient

import (
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// guestError is a request's KindError reply: the guest's words, of the
// class the guest gave them (invalid_argument for a path that names a
// directory, not_found for a missing file), so that the front ends tell a
// caller's mistake from a failure of isopod. A reply without a class is
// an internal failure.
type guestError struct {
	msg   string
	class error
}

func (e *guestError) Error() string { return e.msg }
func (e *guestError) Unwrap() error { return e.class }

// replyErr is the error of the KindError reply m, its message after
// prefix.
func replyErr(prefix string, m *agentproto.Msg) error {
	return &guestError{msg: prefix + m.Error, class: errdefs.FromClass(m.Class)}
}
