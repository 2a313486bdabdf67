package credential

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// TestLoadCAFileNotPlain checks that a ca_file that is not a plain file of
// sane size is refused at once: Load neither blocks on a FIFO nor reads
// /dev/zero or a huge file into memory.
func TestLoadCAFileNotPlain(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ca.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.pem")
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<30); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, ca, want string }{
		{"dev zero", "/dev/zero", "not a regular file"},
		{"fifo", fifo, "not a regular file"},
		{"huge", huge, "over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, t.TempDir(), StoreFile, storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"], "ca_file": "`+tc.ca+`"}`), 0o600)
			done := make(chan error, 1)
			go func() { _, err := Load(p); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, errdefs.ErrFailedPrecondition) || !contains(err, tc.ca, tc.want) {
					t.Errorf("Load: %v; want failed_precondition naming %s and saying %q", err, tc.ca, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Load of a store whose ca_file is %s did not return in 10s", tc.ca)
			}
		})
	}
}

// contains reports whether err's text holds every one of subs.
func contains(err error, subs ...string) bool {
	if err == nil {
		return false
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			return false
		}
	}
	return true
}

// TestLoadSourceNotQuoted checks that a source that is neither env:NAME
// nor file:/path, such as the secret itself written in its place, is
// refused without quoting it.
func TestLoadSourceNotQuoted(t *testing.T) {
	for _, src := range []string{"ghp_LiteralTokenWrittenInPlace", "env:Bearer ghp_LiteralToken", "env:ghp-Literal-Token"} {
		p := writeFile(t, t.TempDir(), StoreFile, storeWith(`{"host": "api.example", "scheme": "bearer", "source": "`+src+`", "allow": ["readonly"]}`), 0o600)
		_, err := Load(p)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || strings.Contains(err.Error(), "LiteralToken") || strings.Contains(err.Error(), "Literal-Token") {
			t.Errorf("Load with source %q: %v; want failed_precondition without the value", src, err)
		}
	}
}

// TestResolveFileSourceNotPlain checks that a file: source that is a FIFO
// or a device is refused at once, never read.
func TestResolveFileSourceNotPlain(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "secret.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{fifo, "/dev/zero"} {
		p := writeFile(t, t.TempDir(), StoreFile, storeWith(`{"host": "api.example", "scheme": "bearer", "source": "file:`+src+`", "allow": ["readonly"]}`), 0o600)
		done := make(chan error, 1)
		go func() { _, err := Resolve(p, []string{"gh"}, Operator, nil, nil); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !contains(err, "not a regular file") {
				t.Errorf("Resolve with source file:%s: %v; want failed_precondition saying not a regular file", src, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Resolve with source file:%s did not return in 10s", src)
		}
	}
}
