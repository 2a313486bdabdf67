package mcpserver

import (
	"testing"

	"isopod/internal/image"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/stages"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/vmrecord"
)

// newFakeCore is the real core (and stage store) over a state root that holds what planning
// a run needs, with vmmfake as its VMM: a "guest" command is a host
// command run by the real agent code, and a guest file is a host file. It
// runs on the CPU alone, in milliseconds, so the server's paths that end
// in the core (copy-out through a held directory, cancellation, the
// release of admission) are tested without QEMU.
func newFakeCore(t testing.TB) (core, *vmmfake.Driver) {
	t.Helper()
	return newFakeCoreOver(t, image.FlavorBaseMin, image.FlavorBaseDebian)
}

// newFakeCoreOver is newFakeCore over a state root with only the bases
// named built.
func newFakeCoreOver(t testing.TB, bases ...string) (core, *vmmfake.Driver) {
	t.Helper()
	p, kernel := sandboxtest.Root(t, bases...)
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	set := settings.Settings{Paths: p, Kernel: kernel, NoWarmPool: true}
	s, err := sandbox.New(sandbox.Options{Settings: set, Driver: d, Version: "test"})
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
	return core{s, stages.New(stages.Options{Settings: set, Version: "test", Removed: s.StageRemoved}), vmrecord.Records{Paths: p}}, d
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
