package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/image"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// newFakeCore is the real core over a state root that holds what planning
// a run needs, with vmmfake as its VMM: a "guest" command is a host
// command run by the real agent code, and a guest file is a host file. It
// runs on the CPU alone, in milliseconds, so the server's paths that end
// in the core (copy-out through a held directory, cancellation, the
// release of admission) are tested without QEMU.
func newFakeCore(t testing.TB) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	kernel := p.Home + "/vmlinuz-builtin"
	fakeWrite(t, kernel, []byte("not a kernel"))
	initrd := image.InitramfsPath(p, true)
	fakeWrite(t, initrd, []byte("not an initramfs"))
	fakeJSON(t, fakeSidecar(initrd), image.InitramfsInfo{
		BuiltInKernel: true, ProtocolVersion: agentproto.Version,
		ContentSHA256: fakeDigest([]byte("not an initramfs")), Size: int64(len("not an initramfs")),
	})
	for _, flavor := range []string{image.FlavorBaseMin, image.FlavorBaseDebian} {
		fakeBase(t, p, flavor)
	}
	tmpl := image.ScratchTemplatePath(p, sandbox.DefaultScratchMiB)
	fakeWrite(t, tmpl, nil)
	if err := os.Truncate(tmpl, 1<<20); err != nil {
		t.Fatal(err)
	}
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sandbox.New(sandbox.Options{Paths: p, Driver: d, Kernel: kernel, Version: "test", NoWarmPool: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Wait()
		for _, m := range d.Machines() {
			select {
			case <-m.Done():
			default:
				t.Errorf("machine %s still runs after the test", m.Config().ID)
				m.Kill()
			}
		}
	})
	return s, d
}

// liveMachines counts the fake's machines still running.
func liveMachines(d *vmmfake.Driver) int {
	n := 0
	for _, m := range d.Machines() {
		select {
		case <-m.Done():
		default:
			n++
		}
	}
	return n
}

// fakeBase writes a base and a record LookupBase accepts.
func fakeBase(t testing.TB, p paths.Paths, flavor string) {
	t.Helper()
	path := image.BasePath(p, flavor)
	data := []byte("not a squashfs: " + flavor)
	fakeWrite(t, path, data)
	for recipe := 0; recipe < 64; recipe++ {
		fakeJSON(t, fakeSidecar(path), image.BaseInfo{
			Flavor: flavor, Recipe: recipe, ContentSHA256: fakeDigest(data),
			ProtocolVersion: agentproto.Version, Size: int64(len(data)),
		})
		if _, err := image.LookupBase(p, flavor); err == nil {
			return
		}
	}
	_, err := image.LookupBase(p, flavor)
	t.Fatalf("no base record that LookupBase accepts: %v", err)
}

func fakeSidecar(path string) string { return path[:strings.LastIndexByte(path, '.')] + ".json" }

func fakeDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func fakeWrite(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func fakeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	fakeWrite(t, path, b)
}
