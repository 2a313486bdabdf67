package oci

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"isopod/internal/errdefs"
)

func TestKeychainReadsDockerConfig(t *testing.T) {
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths":{"registry.example:5000":{"auth":"`+auth+`"}}}`), 0o600)
	repo, _ := name.NewRepository("registry.example:5000/team/app")
	a, err := Keychain{Dir: dir}.Resolve(repo)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := a.Authorization()
	if err != nil || cfg.Username != "alice" || cfg.Password != "s3cret" {
		t.Errorf("credentials %+v, %v; want alice's", cfg, err)
	}
	other, _ := name.NewRepository("elsewhere.example/app")
	if a, _ := (Keychain{Dir: dir}).Resolve(other); a != authn.Anonymous {
		t.Errorf("another registry gets %v; want anonymous", a)
	}
	if a, _ := (Keychain{}).Resolve(repo); a != authn.Anonymous {
		t.Errorf("no configuration directory gives %v; want anonymous", a)
	}
}

func TestVerifier(t *testing.T) {
	data := bytes.Repeat([]byte("layer"), 1000)
	sum := sha256.Sum256(data)
	h := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
	v, _ := NewVerifier(bytes.NewReader(data), h, int64(len(data)), "blob")
	if _, err := io.Copy(io.Discard, v); err != nil || v.Drain() != nil {
		t.Errorf("a good stream: %v", err)
	}
	bad := append([]byte(nil), data...)
	bad[10] ^= 1
	for name, c := range map[string]struct {
		b    []byte
		size int64
	}{"damaged": {bad, int64(len(bad))}, "short": {data[:100], int64(len(data))}, "long": {append(data, 'x'), int64(len(data))}} {
		v, _ := NewVerifier(bytes.NewReader(c.b), h, c.size, "blob")
		_, err := io.Copy(io.Discard, v)
		var de *DigestError
		if !errors.As(err, &de) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v; want a digest refusal", name, err)
		}
	}
	if _, err := NewVerifier(bytes.NewReader(data), v1.Hash{Algorithm: "sha512", Hex: "00"}, -1, "blob"); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("a sha512 digest: %v; want not supported", err)
	}
}
