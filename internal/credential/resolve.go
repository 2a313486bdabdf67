package credential

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"isopod/internal/errdefs"
)

// ModelRefusal is the one message a Model caller gets for every refusal:
// it says neither whether an alias exists nor why it was refused.
const ModelRefusal = "credentials: the aliases named cannot be used by this caller: ask the operator which aliases are offered"

// errModelRefused is every refusal a Model caller gets.
var errModelRefused = fmt.Errorf("%s: %w", ModelRefusal, errdefs.ErrInvalidArgument)

// Resolve loads the store at path and resolves names (all or nothing)
// for caller, reading each secret from its source with lookupEnv (nil:
// no variable is set). No names: no I/O at all. An unknown alias is
// errdefs.ErrNotFound; a bad store or source, or a missing store,
// errdefs.ErrFailedPrecondition; a malformed name
// errdefs.ErrInvalidArgument. For a Model caller every refusal, an alias
// without "mcp": true included, is one uniform errdefs.ErrInvalidArgument
// ([ModelRefusal]) and the reason goes to log. No error ever holds a
// secret. Names are matched ignoring case; one named twice is resolved
// once.
func Resolve(path string, names []string, caller Caller, lookupEnv func(string) (string, bool), log *slog.Logger) ([]Credential, error) {
	if len(names) == 0 {
		return nil, nil
	}
	creds, err := resolve(path, names, caller, lookupEnv)
	if err != nil && caller == Model {
		if log != nil {
			log.Warn("credential aliases refused to a model caller", "aliases", printable(names), "reason", err)
		}
		return nil, errModelRefused
	}
	return creds, err
}

// resolve is Resolve with the reason of a refusal.
func resolve(path string, names []string, caller Caller, lookupEnv func(string) (string, bool)) ([]Credential, error) {
	var keys []string
	for _, n := range names {
		if !aliasName.MatchString(n) {
			return nil, fmt.Errorf("credential alias %s: an alias is 1 to 64 letters, digits, '-' and '_': %w", printable([]string{n})[0], errdefs.ErrInvalidArgument)
		}
		if k := strings.ToLower(n); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	st, err := Load(path)
	if errors.Is(err, errMissing) {
		return nil, fmt.Errorf("credential store %s does not exist: create it, mode 600, as docs/credentials.md shows "+
			`({"version": 1, "credentials": {"<alias>": {...}}}): %w`, path, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, err
	}
	creds := make([]Credential, 0, len(keys))
	for _, k := range keys {
		a, ok := st.Aliases[k]
		if !ok {
			return nil, fmt.Errorf("credential alias %q is not declared in %s: add it there, or name one of its aliases: %w", k, path, errdefs.ErrNotFound)
		}
		if caller == Model && !a.MCP {
			return nil, fmt.Errorf(`credential alias %q is not offered to models: set "mcp": true on it in %s: %w`, k, path, errdefs.ErrFailedPrecondition)
		}
		s, err := readSecret(a.Source, lookupEnv)
		if err != nil {
			return nil, fmt.Errorf("credential alias %q in %s: source %s: %w", k, path, a.Source, err)
		}
		creds = append(creds, Credential{Alias: a, secret: s})
	}
	return creds, nil
}

// readSecret reads a secret from its source: an environment variable
// (set and not empty), or a private file (see readPrivate) whose trailing
// CR and LF are dropped. Errors are errdefs.ErrFailedPrecondition and
// never hold the value.
func readSecret(src string, lookupEnv func(string) (string, bool)) (Secret, error) {
	var v []byte
	if name, ok := strings.CutPrefix(src, "env:"); ok {
		var val string
		if lookupEnv != nil {
			val, ok = lookupEnv(name)
		}
		if !ok || val == "" {
			return Secret{}, fmt.Errorf("%s is not set, or empty: export it where isopod runs: %w", name, errdefs.ErrFailedPrecondition)
		}
		v = []byte(val)
	} else if p, ok := strings.CutPrefix(src, "file:"); ok {
		b, err := readPrivate(p)
		if err != nil {
			return Secret{}, err
		}
		v = bytes.TrimRight(b, "\r\n")
	} else {
		return Secret{}, fmt.Errorf("unknown source kind: use env:NAME or file:/absolute/path: %w", errdefs.ErrFailedPrecondition)
	}
	s, err := newSecret(v)
	clear(v)
	if err != nil {
		return Secret{}, fmt.Errorf("%w: fix the value the source holds: %w", err, errdefs.ErrFailedPrecondition)
	}
	return s, nil
}

// printable quotes names for a log or an error, each cut to 64 bytes.
func printable(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		if len(n) > 64 {
			n = n[:64]
		}
		out[i] = fmt.Sprintf("%q", n)
	}
	return out
}
