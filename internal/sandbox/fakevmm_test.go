package sandbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/image"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// Helpers for running the core on the CPU alone: a state root that holds
// what planning a run needs, and a Service whose VMM is vmmfake, so that a
// "guest" command is a host command run by the real agent.

// newTestRoot makes a state root with a built-in kernel, its initramfs
// record, base-min with its record, and the default scratch template. None
// is a real image: the fake VMM reads none of them.
func newTestRoot(t *testing.T) (paths.Paths, string) {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	kernel := p.Home + "/vmlinuz-builtin"
	writeFile(t, kernel, []byte("not a kernel"))

	initrd := image.InitramfsPath(p, true)
	writeFile(t, initrd, []byte("not an initramfs"))
	writeJSON(t, sidecar(initrd), image.InitramfsInfo{
		BuiltInKernel: true, ProtocolVersion: agentproto.Version,
		ContentSHA256: digest([]byte("not an initramfs")), Size: int64(len("not an initramfs")),
	})
	if _, err := image.ResolveBoot(p, kernel); err != nil {
		t.Fatalf("the fake initramfs is refused: %v", err)
	}
	writeBase(t, p, image.FlavorBaseMin)

	tmpl := image.ScratchTemplatePath(p, sandbox.DefaultScratchMiB)
	writeFile(t, tmpl, nil)
	if err := os.Truncate(tmpl, 1<<20); err != nil {
		t.Fatal(err)
	}
	return p, kernel
}

// writeBase writes a base and its record. The record's build recipe
// revision is the image package's own business: the first one LookupBase
// accepts is kept.
func writeBase(t *testing.T, p paths.Paths, flavor string) {
	t.Helper()
	path := image.BasePath(p, flavor)
	data := []byte("not a squashfs: " + flavor)
	writeFile(t, path, data)
	for recipe := 0; recipe < 64; recipe++ {
		writeJSON(t, sidecar(path), image.BaseInfo{
			Flavor: flavor, Recipe: recipe, ContentSHA256: digest(data),
			ProtocolVersion: agentproto.Version, Size: int64(len(data)),
		})
		if _, err := image.LookupBase(p, flavor); err == nil {
			return
		}
	}
	_, err := image.LookupBase(p, flavor)
	t.Fatalf("no base record that LookupBase accepts: %v", err)
}

// sidecar is an image's JSON record beside it.
func sidecar(path string) string {
	return path[:strings.LastIndexByte(path, '.')] + ".json"
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, b)
}

// newFakeService returns a Service over a fresh test root whose VMM is a
// vmmfake Driver with cfg.
func newFakeService(t *testing.T, cfg vmmfake.Config) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFake(t, cfg, false)
}

// newColdService is newFakeService without the warm pool: every run boots.
func newColdService(t *testing.T, cfg vmmfake.Config) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFake(t, cfg, true)
}

func newFake(t *testing.T, cfg vmmfake.Config, noWarm bool) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFakeWith(t, cfg, func(o *sandbox.Options) { o.NoWarmPool = noWarm })
}

// newFakeWith is newFakeService with the Options adjusted by tweak. The
// Service is closed when the test ends.
func newFakeWith(t *testing.T, cfg vmmfake.Config, tweak func(*sandbox.Options)) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	p, kernel := newTestRoot(t)
	d, err := vmmfake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := sandbox.Options{Paths: p, Driver: d, Kernel: kernel, Version: "test"}
	tweak(&o)
	s, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
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

// run runs req with a bounded context and fails the test on an error.
func run(t *testing.T, s *sandbox.Service, req sandbox.Request) *sandbox.Report {
	t.Helper()
	rep, err := runErr(t, s, req)
	if err != nil {
		t.Fatalf("Run %q: %v", req.Argv, err)
	}
	return rep
}

func runErr(t *testing.T, s *sandbox.Service, req sandbox.Request) (*sandbox.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if req.Cwd == "" {
		req.Cwd = "/"
	}
	return s.Run(ctx, req)
}

func code(rep *sandbox.Report) int {
	if rep.ExitCode == nil {
		return -1
	}
	return *rep.ExitCode
}
