package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
)

func TestResolve(t *testing.T) {
	s := newStore(t)
	deps := mustCommit(t, s, req(smallLayer(t, 1), "proj/deps", ""))
	build := mustCommit(t, s, req(smallLayer(t, 2), "proj/build", deps.ID))
	other := mustCommit(t, s, req(smallLayer(t, 3), "other", ""))

	found := []struct {
		name, ref string
		want      Meta
	}{
		{"id", build.ID, build},
		{"vanity name", other.Name, other},
		{"label", "proj/deps", deps},
		{"unique label prefix", "oth", other},
		{"unique longer prefix", "proj/b", build},
	}
	for _, tc := range found {
		t.Run(tc.name, func(t *testing.T) {
			m, err := s.Resolve(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			if m.ID != tc.want.ID || m.IsBase() {
				t.Errorf("Resolve(%q) = %s, want %s", tc.ref, m.ID, tc.want.ID)
			}
		})
	}
	t.Run("base", func(t *testing.T) {
		m, err := s.Resolve("base")
		if err != nil || !m.IsBase() {
			t.Fatalf("Resolve(base) = %+v, %v; want the base stage", m, err)
		}
		if chain, err := s.Chain(m); err != nil || len(chain) != 0 {
			t.Errorf("Chain(base) = %v, %v; want no layers", chain, err)
		}
	})
	t.Run("ambiguous prefix", func(t *testing.T) {
		_, err := s.Resolve("proj/")
		wantErr(t, err, errdefs.ErrInvalidArgument, "ambiguous", "proj/deps", "proj/build")
	})
	t.Run("unknown", func(t *testing.T) {
		_, err := s.Resolve("nothing")
		wantErr(t, err, errdefs.ErrNotFound, "isopod stage list")
		_, err = s.Resolve("st-ffffffffffffffff")
		wantErr(t, err, errdefs.ErrNotFound)
	})
	t.Run("empty", func(t *testing.T) {
		_, err := s.Resolve("")
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
	t.Run("log", func(t *testing.T) {
		log, err := s.Log("proj/build")
		if err != nil || len(log) != 2 || log[0].ID != deps.ID || log[1].ID != build.ID {
			t.Errorf("Log = %v, %v; want deps then build", log, err)
		}
	})
	t.Run("list order", func(t *testing.T) {
		list, err := s.List()
		if err != nil || len(list) != 3 || list[0].ID != deps.ID || list[1].ID != build.ID || list[2].ID != other.ID {
			t.Errorf("List = %v, %v; want oldest first", list, err)
		}
	})
}

func TestCheckBase(t *testing.T) {
	st := func(id, flavor, sha string) Meta {
		return Meta{ID: id, Name: "shy-" + id, Label: "l-" + id, BaseFlavor: flavor, BaseSHA256: sha}
	}
	good := st("st-000000000000000a", testFlavor, testSHA)
	old := st("st-000000000000000b", testFlavor, otherSHA)
	unrecorded := st("st-000000000000000c", testFlavor, "")
	full := st("st-000000000000000d", "base-full", testSHA)
	tests := []struct {
		name      string
		chain     []Meta
		current   string
		skew      bool
		wantErr   error
		mention   []string
		wantWarns int
	}{
		{"empty chain", nil, testSHA, false, nil, nil, 0},
		{"all match", []Meta{good, good}, testSHA, false, nil, nil, 0},
		{"other build refused", []Meta{good, old}, testSHA, false, errdefs.ErrFailedPrecondition,
			[]string{old.ID, otherSHA, testSHA, "--stage base", "ISOPOD_ALLOW_BASE_SKEW=1"}, 0},
		{"other build allowed with skew", []Meta{good, old}, testSHA, true, nil, []string{old.ID, otherSHA, testSHA}, 1},
		{"no recorded build warns", []Meta{unrecorded}, testSHA, false, nil, []string{unrecorded.ID, "no base build id"}, 1},
		{"installed build unknown warns", []Meta{good}, "", false, nil, []string{good.ID}, 1},
		{"other flavor refused", []Meta{good, full}, testSHA, false, errdefs.ErrInvalidArgument, []string{"base-full", testFlavor}, 0},
		{"other flavor refused even with skew", []Meta{full}, testSHA, true, errdefs.ErrInvalidArgument, []string{"base-full"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			warns, err := CheckBase(tc.chain, testFlavor, tc.current, tc.skew)
			if tc.wantErr != nil {
				wantErr(t, err, tc.wantErr, tc.mention...)
				return
			}
			if err != nil {
				t.Fatalf("CheckBase: %v", err)
			}
			if len(warns) != tc.wantWarns {
				t.Fatalf("warnings %q, want %d", warns, tc.wantWarns)
			}
			all := strings.Join(warns, "\n")
			for _, m := range tc.mention {
				if !strings.Contains(all, m) {
					t.Errorf("warnings %q do not mention %q", all, m)
				}
			}
		})
	}
}

func TestRemove(t *testing.T) {
	s := newStore(t)
	parent := mustCommit(t, s, req(smallLayer(t, 1), "parent", ""))
	child := mustCommit(t, s, req(smallLayer(t, 2), "child", parent.ID))
	grand := mustCommit(t, s, req(smallLayer(t, 3), "grandchild", child.ID))
	ctx := context.Background()

	_, err := s.Remove(ctx, "parent")
	wantErr(t, err, errdefs.ErrFailedPrecondition, parent.ID, child.ID, grand.ID, "leaf first")
	_, err = s.Remove(ctx, "child")
	wantErr(t, err, errdefs.ErrFailedPrecondition, grand.ID)
	_, err = s.Remove(ctx, "base")
	wantErr(t, err, errdefs.ErrInvalidArgument)
	_, err = s.Remove(ctx, "nothing")
	wantErr(t, err, errdefs.ErrNotFound)

	for _, ref := range []string{grand.Name, child.ID, "parent"} {
		if _, err := s.Remove(ctx, ref); err != nil {
			t.Fatalf("Remove(%s): %v", ref, err)
		}
	}
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v; want empty", list, err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), parent.ID)); !os.IsNotExist(err) {
		t.Errorf("stage directory remains: %v", err)
	}
	noTemps(t, s)
}

func TestGC(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Minute)
	mk := func(name string, locked bool) string {
		t.Helper()
		d := filepath.Join(s.Dir(), name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "layer.ext4"), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
		if locked {
			fl := flock.New(filepath.Join(d, ".lock"))
			if ok, err := fl.TryLock(); !ok || err != nil {
				t.Fatalf("locking: %v", err)
			}
			t.Cleanup(func() { _ = fl.Close() })
		}
		return d
	}
	stale := mk(".tmp-st-00000000000000aa-1", false)
	busy := mk(".tmp-st-00000000000000bb-2", true)
	fresh := mk(".tmp-st-00000000000000cc-3", false)
	for _, d := range []string{stale, busy} {
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
	kept := mustCommit(t, s, req(smallLayer(t, 1), "kept", ""))

	if list, err := s.List(); err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v; want only the published stage", list, err)
	}
	removed, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != filepath.Base(stale) {
		t.Errorf("GC removed %v, want only %s", removed, filepath.Base(stale))
	}
	for _, d := range []string{busy, fresh, s.LayerPath(kept.ID)} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s should remain: %v", d, err)
		}
	}
}

func TestInterruptedCommit(t *testing.T) {
	s := newStore(t)
	locks := filepath.Join(filepath.Dir(s.Dir()), "locks")
	cmd, out := startHelper(t, s, locks, smallLayer(t, 5), "interrupted", "", true)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out(), "STALLED") {
		if time.Now().After(deadline) {
			t.Fatalf("helper did not reach the stall point: %s", out())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// While the commit runs, its directory is locked: GC leaves it alone
	// even when it looks old.
	if removed, err := s.gc(context.Background(), time.Now().Add(time.Hour)); err != nil || len(removed) != 0 {
		t.Fatalf("GC during a live commit removed %v, %v", removed, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Fatalf("List after an interrupted commit = %v, %v; want nothing", list, err)
	}
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 1 || !isTemp(ents[0].Name()) {
		t.Fatalf("stages directory holds %v, want one temporary directory", ents)
	}
	// A lock file younger than lockGrace may belong to a writer that has
	// just made its directory: kept. An older one that nobody holds was
	// left by a dead writer: GC removes it at once, without waiting for
	// the directory to be a minute old.
	lock := filepath.Join(s.Dir(), ents[0].Name(), ".lock")
	now := time.Now()
	if err := os.Chtimes(lock, now, now); err != nil {
		t.Fatal(err)
	}
	if removed, err := s.GC(context.Background()); err != nil || len(removed) != 0 {
		t.Fatalf("GC removed a leftover whose lock was just made: %v, %v", removed, err)
	}
	then := now.Add(-2 * lockGrace)
	if err := os.Chtimes(lock, then, then); err != nil {
		t.Fatal(err)
	}
	removed, err := s.GC(context.Background())
	if err != nil || len(removed) != 1 {
		t.Fatalf("GC of the dead commit's leftover removed %v, %v", removed, err)
	}
	noTemps(t, s)
	// The label is free again.
	mustCommit(t, s, req(smallLayer(t, 5), "interrupted", ""))
}
