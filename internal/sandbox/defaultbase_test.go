package sandbox_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/vmm/vmmfake"
)

// newFakeOver is a cold fake-VMM Service over a state root with only the
// bases named built.
func newFakeOver(t *testing.T, bases ...string) *sandbox.Service {
	t.Helper()
	p, kernel := sandboxtest.Root(t, bases...)
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sandbox.New(sandbox.Options{Settings: settings.Settings{Paths: p, Kernel: kernel, NoWarmPool: true}, Driver: d, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestDefaultBaseFallback: a run that names no base boots the front end's
// default when it is built, and base-min with a warning naming the build
// command when it is not; a base named explicitly is never swapped.
func TestDefaultBaseFallback(t *testing.T) {
	t.Parallel()
	debian := sandbox.Request{Argv: []string{"true"}, NoNetwork: true, DefaultBase: image.FlavorBaseDebian}
	buildHint := "isopod image build " + image.FlavorBaseDebian
	hinted := func(ws []string) bool {
		return slices.ContainsFunc(ws, func(w string) bool { return strings.Contains(w, buildHint) })
	}

	t.Run("default built", func(t *testing.T) {
		s := newFakeOver(t, image.FlavorBaseMin, image.FlavorBaseDebian)
		rep := run(t, s, debian)
		if rep.RootfsFlavor != image.FlavorBaseDebian || len(rep.Warnings) != 0 {
			t.Errorf("rootfs %s, warnings %q; want base-debian and none", rep.RootfsFlavor, rep.Warnings)
		}
	})
	t.Run("default not built", func(t *testing.T) {
		s := newFakeOver(t, image.FlavorBaseMin)
		rep := run(t, s, debian)
		if rep.RootfsFlavor != image.FlavorBaseMin || !hinted(rep.Warnings) || code(rep) != 0 {
			t.Errorf("rootfs %s, exit %d, warnings %q; want base-min and a warning naming %q", rep.RootfsFlavor, code(rep), rep.Warnings, buildHint)
		}
		// Named, it is not swapped: the error says how to build it.
		named := debian
		named.Base = image.FlavorBaseDebian
		_, err := runErr(t, s, named)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), buildHint) {
			t.Errorf("an explicit unbuilt base: %v; want failed_precondition naming %q", err, buildHint)
		}
	})
	t.Run("no default of the front end's", func(t *testing.T) {
		s := newFakeOver(t, image.FlavorBaseMin)
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true})
		if rep.RootfsFlavor != sandbox.DefaultBase || len(rep.Warnings) != 0 {
			t.Errorf("rootfs %s, warnings %q; want %s and none", rep.RootfsFlavor, rep.Warnings, sandbox.DefaultBase)
		}
	})
	t.Run("no base built", func(t *testing.T) {
		s := newFakeOver(t)
		_, err := runErr(t, s, debian)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), buildHint) {
			t.Errorf("no base built: %v; want the default's own error, naming %q", err, buildHint)
		}
	})
}
