package credential

import (
	"fmt"
	"log/slog"

	"isopod/internal/errdefs"
)

// Scheme is how a secret is presented upstream.
type Scheme string

const (
	SchemeBearer Scheme = "bearer" // Authorization: Bearer <secret>
	SchemeBasic  Scheme = "basic"  // Authorization: Basic base64(user:secret)
	SchemeHeader Scheme = "header" // <Header>: <secret>
)

// Alias is one declaration of the store, validated.
type Alias struct {
	Name   string // lower case
	Host   string // one exact name, normalised
	Scheme Scheme
	User   string // basic only
	Header string // header only
	Source string // env:NAME or file:/absolute/path
	Allow  []Rule
	MCP    bool
	CAFile string // optional: PEM roots added to the system's for Host
}

// Rule is one parsed allow entry.
type Rule struct {
	Methods []string // GET HEAD ... ; readonly is GET and HEAD
	Pattern string   // /path/glob: * one segment, trailing ** any suffix
}

// Store is the parsed credentials file.
type Store struct {
	Path    string
	Aliases map[string]Alias
}

// Load reads and validates the store at path: a regular file owned by
// this user, no group or other permission bits, under 64 KiB, a known
// version. Errors are errdefs.ErrFailedPrecondition and name the file and
// the fix.
func Load(path string) (*Store, error) {
	return nil, fmt.Errorf("credential store %s: not implemented: %w", path, errdefs.ErrNotSupported)
}

// Resolve loads the store at path and resolves names (all or nothing)
// for caller, reading each secret from its source with lookupEnv. No
// names: no I/O at all. An unknown alias is errdefs.ErrNotFound; a bad
// store or source errdefs.ErrFailedPrecondition; for a Model caller every
// refusal is one uniform errdefs.ErrInvalidArgument (the reason goes to
// log). No error ever holds a secret.
func Resolve(path string, names []string, caller Caller, lookupEnv func(string) (string, bool), log *slog.Logger) ([]Credential, error) {
	if len(names) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("credential store %s: not implemented: %w", path, errdefs.ErrNotSupported)
}
