// Package sandboxtest builds state roots for tests that run the core over
// the in-memory VMM (vmmfake): every file a Service checks before a run is
// present with a record it accepts, and none is a real image, since the
// fake VMM reads none of them.
package sandboxtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/image"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
)

// Root makes a state root in a fresh temporary directory with a kernel,
// an initramfs that has the modules built in, a base of each flavor (with
// its record) and the default scratch template. It returns the root and
// the kernel's path.
func Root(t testing.TB, flavors ...string) (paths.Paths, string) {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The runs' socket directory of this state root, empty once they ended.
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("isopod-%d", os.Getuid()), p.Scope())) })
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	kernel := p.Home + "/vmlinuz-builtin"
	WriteFile(t, kernel, []byte("not a kernel"))

	initrd := image.InitramfsPath(p, true)
	WriteFile(t, initrd, []byte("not an initramfs"))
	WriteJSON(t, Sidecar(initrd), image.InitramfsInfo{
		BuiltInKernel: true, ProtocolVersion: agentproto.Version,
		ContentSHA256: Digest([]byte("not an initramfs")), Size: int64(len("not an initramfs")),
	})
	if _, err := image.ResolveBoot(p, kernel); err != nil {
		t.Fatalf("the fake initramfs is refused: %v", err)
	}
	for _, flavor := range flavors {
		writeBase(t, p, flavor)
	}
	tmpl := image.ScratchTemplatePath(p, sandbox.DefaultScratchMiB)
	WriteFile(t, tmpl, nil)
	if err := os.Truncate(tmpl, 1<<20); err != nil {
		t.Fatal(err)
	}
	return p, kernel
}

// writeBase writes a base and its record. The record's build recipe
// revision is the image package's own business: the first one LookupBase
// accepts is kept.
func writeBase(t testing.TB, p paths.Paths, flavor string) {
	t.Helper()
	path := image.BasePath(p, flavor)
	data := []byte("not a squashfs: " + flavor)
	WriteFile(t, path, data)
	for recipe := 0; recipe < 64; recipe++ {
		WriteJSON(t, Sidecar(path), image.BaseInfo{
			Flavor: flavor, Recipe: recipe, ContentSHA256: Digest(data),
			ProtocolVersion: agentproto.Version, Size: int64(len(data)),
		})
		if _, err := image.LookupBase(p, flavor); err == nil {
			return
		}
	}
	_, err := image.LookupBase(p, flavor)
	t.Fatalf("no base record that LookupBase accepts: %v", err)
}

// Sidecar is an image's JSON record beside it.
func Sidecar(path string) string {
	return path[:strings.LastIndexByte(path, '.')] + ".json"
}

// Digest is the hex SHA-256 of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// WriteFile writes data to path or fails the test.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// WriteJSON writes v as JSON to path or fails the test.
func WriteJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	WriteFile(t, path, b)
}
