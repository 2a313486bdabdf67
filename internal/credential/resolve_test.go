package credential

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// envOf is a lookupEnv over m.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// resolveStore writes a store of several aliases and secret files in a
// fresh directory and returns the store's path.
func resolveStore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	good := writeFile(t, dir, "good.tok", testSecret+"\r\n", 0o600)
	loose := writeFile(t, dir, "loose.tok", testSecret, 0o644)
	bin := writeFile(t, dir, "bin.tok", testSecret+"\x01", 0o600)
	return writeFile(t, dir, StoreFile, `{"version": 1, "credentials": {
		"env": {"host": "api.example", "scheme": "bearer", "source": "env:TOK", "allow": ["readonly"], "mcp": true},
		"file": {"host": "api.example", "scheme": "bearer", "source": "file:`+good+`", "allow": ["readonly"], "mcp": true},
		"private": {"host": "api.example", "scheme": "bearer", "source": "env:TOK", "allow": ["readonly"]},
		"unset": {"host": "api.example", "scheme": "bearer", "source": "env:UNSET", "allow": ["readonly"], "mcp": true},
		"empty": {"host": "api.example", "scheme": "bearer", "source": "env:EMPTY", "allow": ["readonly"], "mcp": true},
		"badval": {"host": "api.example", "scheme": "bearer", "source": "env:BAD", "allow": ["readonly"], "mcp": true},
		"loose": {"host": "api.example", "scheme": "bearer", "source": "file:`+loose+`", "allow": ["readonly"], "mcp": true},
		"bin": {"host": "api.example", "scheme": "bearer", "source": "file:`+bin+`", "allow": ["readonly"], "mcp": true},
		"gone": {"host": "api.example", "scheme": "bearer", "source": "file:`+filepath.Join(dir, "gone")+`", "allow": ["readonly"], "mcp": true}}}`, 0o600)
}

var testEnv = envOf(map[string]string{"TOK": testSecret, "EMPTY": "", "BAD": testSecret + "\n"})

// TestResolve checks resolution for an operator: both sources, names
// matched ignoring case and resolved once.
func TestResolve(t *testing.T) {
	p := resolveStore(t)
	creds, err := Resolve(p, []string{"ENV", "file", "env", "private"}, Operator, testEnv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(creds) != 3 || creds[0].Alias.Name != "env" || creds[1].Alias.Name != "file" || creds[2].Alias.Name != "private" {
		t.Fatalf("resolved %v", creds)
	}
	for _, c := range creds {
		if c.secret.empty() || string(c.secret.v.b) != testSecret {
			t.Errorf("%s: secret not read as the source holds it (CR/LF trimmed)", c.Alias.Name)
		}
	}
	if creds, err := Resolve(filepath.Join(t.TempDir(), "none", StoreFile), nil, Model, nil, nil); creds != nil || err != nil {
		t.Errorf("no names: %v, %v; want nothing and no error", creds, err)
	}
}

// TestResolveRefusals checks each refusal for an operator (its class,
// the file and the fix named) and that the same refusal reaches a model
// as one uniform message, the reason logged. No error or log line holds
// the secret.
func TestResolveRefusals(t *testing.T) {
	p := resolveStore(t)
	loose := writeFile(t, t.TempDir(), StoreFile, `{"version": 1, "credentials": {}}`, 0o644)
	missing := filepath.Join(t.TempDir(), StoreFile)
	for _, tt := range []struct {
		name, store string
		aliases     []string
		class       error
		want        string
	}{
		{"unknown alias", p, []string{"env", "nope"}, errdefs.ErrNotFound, "not declared in " + p},
		{"malformed name", p, []string{"a/b"}, errdefs.ErrInvalidArgument, "letters, digits"},
		{"env unset", p, []string{"unset"}, errdefs.ErrFailedPrecondition, "UNSET is not set"},
		{"env empty", p, []string{"empty"}, errdefs.ErrFailedPrecondition, "EMPTY is not set, or empty"},
		{"env bad bytes", p, []string{"badval"}, errdefs.ErrFailedPrecondition, "outside visible ASCII"},
		{"file mode", p, []string{"loose"}, errdefs.ErrFailedPrecondition, "chmod 600"},
		{"file bad bytes", p, []string{"bin"}, errdefs.ErrFailedPrecondition, "outside visible ASCII"},
		{"file missing", p, []string{"gone"}, errdefs.ErrFailedPrecondition, "gone does not exist"},
		{"bad store", loose, []string{"env"}, errdefs.ErrFailedPrecondition, "chmod 600 " + loose},
		{"missing store", missing, []string{"env"}, errdefs.ErrFailedPrecondition, missing + " does not exist: create it, mode 600"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Resolve(tt.store, tt.aliases, Operator, testEnv, nil)
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("operator: %v; want %s saying %q", err, errdefs.Class(tt.class), tt.want)
			}
			if err != nil && strings.Contains(err.Error(), testSecret) {
				t.Errorf("operator: the secret shows in %v", err)
			}
			checkModelRefusal(t, tt.store, tt.aliases)
		})
	}
	t.Run("mcp false", func(t *testing.T) {
		if _, err := Resolve(p, []string{"private"}, Operator, testEnv, nil); err != nil {
			t.Fatalf("operator: %v", err)
		}
		checkModelRefusal(t, p, []string{"private"})
	})
	creds, err := Resolve(p, []string{"env", "file"}, Model, testEnv, nil)
	if err != nil || len(creds) != 2 {
		t.Errorf("model, aliases with mcp true: %v, %v", creds, err)
	}
}

// checkModelRefusal checks that a model naming aliases gets the uniform
// refusal, and that the log says why without the secret.
func checkModelRefusal(t *testing.T, store string, aliases []string) {
	t.Helper()
	var logs bytes.Buffer
	_, err := Resolve(store, aliases, Model, testEnv, slog.New(slog.NewTextHandler(&logs, nil)))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != errModelRefused.Error() {
		t.Errorf("model: %v; want the uniform %v", err, errModelRefused)
	}
	if !strings.Contains(logs.String(), "reason=") {
		t.Errorf("model refusal logged %q; want the reason", logs.String())
	}
	if strings.Contains(logs.String(), testSecret) || strings.Contains(err.Error(), testSecret) {
		t.Errorf("the secret shows in %q or %q", logs.String(), err)
	}
}
