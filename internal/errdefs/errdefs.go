// Package errdefs holds the small set of error classes that isopod's front
// ends map to exit codes and tool errors. Wrap one with fmt.Errorf("...: %w",
// errdefs.ErrInvalidArgument) and match it with errors.Is.
package errdefs

import "errors"

var (
	// ErrInvalidArgument: the caller asked for something that can never work
	// (a flag out of range, a malformed label). Detected before any VM starts.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: a named thing (stage, image, VM, file) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a unique name is taken.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the request is valid but the host is not in a
	// state to serve it (image not built, protocol mismatch, stale base).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable: a resource or peer did not answer in time.
	ErrUnavailable = errors.New("unavailable")
	// ErrNotSupported: the host lacks a capability (no KVM for Firecracker).
	ErrNotSupported = errors.New("not supported")
	// ErrResourceExhausted: serving the request would go over a budget a
	// setting sets (the disk paused sessions hold).
	ErrResourceExhausted = errors.New("resource exhausted")
)

// Class names the class of err for reports ("invalid_argument", ...), or
// "internal" when err carries none.
func Class(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrAlreadyExists):
		return "already_exists"
	case errors.Is(err, ErrFailedPrecondition):
		return "failed_precondition"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrNotSupported):
		return "not_supported"
	case errors.Is(err, ErrResourceExhausted):
		return "resource_exhausted"
	}
	return "internal"
}

// FromClass is the class named by Class's name (as a peer that cannot
// share errors sends it), or nil for "internal", "" and names it does not
// know.
func FromClass(name string) error {
	for _, e := range []error{ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrFailedPrecondition, ErrUnavailable, ErrNotSupported, ErrResourceExhausted} {
		if Class(e) == name {
			return e
		}
	}
	return nil
}
