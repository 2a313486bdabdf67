package storetest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// testChains checks that a stage's chain runs from its root to itself,
// that Chain and Log read it back, and that a parent must exist and share
// the base.
func testChains(t *testing.T, s store.Interface) {
	a := MustCommit(t, s, Req(Layer(t, 1), "a", ""))
	b := MustCommit(t, s, Req(Layer(t, 2), "b", a.ID))
	c := MustCommit(t, s, Req(Layer(t, 3), "c", b.ID))
	want := []string{a.ID, b.ID, c.ID}
	if c.Parent != b.ID || !slices.Equal(c.Chain, want) {
		t.Errorf("parent %s, chain %v; want %s and %v", c.Parent, c.Chain, b.ID, want)
	}
	chain, err := s.Chain(c)
	if err != nil || !slices.Equal(ids(chain), want) {
		t.Errorf("Chain = %v, %v; want %v", ids(chain), err, want)
	}
	logged, err := s.Log("c")
	if err != nil || !slices.Equal(ids(logged), want) {
		t.Errorf("Log(c) = %v, %v; want %v", ids(logged), err, want)
	}
	if len(chain) == 3 {
		sameMeta(t, "the chain's middle", chain[1], b)
	}
	if l, err := s.Log(store.BaseRef); err != nil || len(l) != 0 {
		t.Errorf("Log(base) = %v, %v; want no layers", ids(l), err)
	}
	if l, err := s.Chain(store.Meta{}); err != nil || len(l) != 0 {
		t.Errorf("Chain of the base = %v, %v; want no layers", ids(l), err)
	}
	_, err = s.Log("nothing")
	wantErr(t, "Log of an unknown stage", err, errdefs.ErrNotFound)

	scratch := Layer(t, 4)
	otherFlavor, skewed := Req(scratch, "d", c.ID), Req(scratch, "d", c.ID)
	otherFlavor.BaseFlavor = "base-debian"
	skewed.BaseSHA256 = OtherSHA
	refused := []struct {
		what string
		req  store.CommitRequest
		want error
	}{
		{"over an unknown parent", Req(scratch, "d", "st-ffffffffffffffff"), errdefs.ErrNotFound},
		{"over a malformed parent", Req(scratch, "d", "c"), errdefs.ErrInvalidArgument},
		{"over another base flavor", otherFlavor, errdefs.ErrInvalidArgument},
		{"over another build of the base", skewed, errdefs.ErrFailedPrecondition},
	}
	for _, tc := range refused {
		_, _, err := s.Commit(t.Context(), tc.req)
		wantErr(t, "Commit "+tc.what, err, tc.want)
		wantErr(t, "CheckCommit "+tc.what, s.CheckCommit(tc.req), tc.want)
	}
	skewed.AllowBaseSkew = true
	if m := MustCommit(t, s, skewed); m.Parent != c.ID || m.BaseSHA256 != OtherSHA {
		t.Errorf("a commit allowed over another build: parent %s, base build %s", m.Parent, m.BaseSHA256)
	}
}

// testChainDepth checks that a chain holds at most store.MaxChainDepth
// layers.
func testChainDepth(t *testing.T, s store.Interface) {
	parent := ""
	var tip store.Meta
	for i := range store.MaxChainDepth {
		tip = MustCommit(t, s, Req(Layer(t, uint64(i)), fmt.Sprintf("layer-%d", i), parent))
		parent = tip.ID
	}
	if len(tip.Chain) != store.MaxChainDepth {
		t.Fatalf("chain of %d layers; want %d", len(tip.Chain), store.MaxChainDepth)
	}
	over := Req(Layer(t, 99), "one-too-many", tip.ID)
	_, _, err := s.Commit(t.Context(), over)
	wantErr(t, "Commit past the depth limit", err, errdefs.ErrInvalidArgument)
	wantErr(t, "CheckCommit past the depth limit", s.CheckCommit(over), errdefs.ErrInvalidArgument)
	if l := listIDs(t, s); len(l) != store.MaxChainDepth {
		t.Errorf("%d stages after a refused commit; want %d", len(l), store.MaxChainDepth)
	}
}

// testRemove checks that a stage is removed only when no other chain uses
// it, leaf first, and that its label and content are free again after.
func testRemove(t *testing.T, s store.Interface) {
	a := MustCommit(t, s, Req(Layer(t, 1), "a", ""))
	b := MustCommit(t, s, Req(Layer(t, 2), "b", a.ID))
	_, err := s.Remove(t.Context(), "a")
	wantErr(t, "Remove of a stage with a child", err, errdefs.ErrFailedPrecondition)
	if _, err := s.Get(a.ID); err != nil {
		t.Errorf("the refused stage is gone: %v", err)
	}
	for what, ref := range map[string]string{"the base": store.BaseRef, "an empty reference": ""} {
		_, err := s.Remove(t.Context(), ref)
		wantErr(t, "Remove of "+what, err, errdefs.ErrInvalidArgument)
	}
	_, err = s.Remove(t.Context(), "nothing")
	wantErr(t, "Remove of an unknown stage", err, errdefs.ErrNotFound)

	got, err := s.Remove(t.Context(), b.Name)
	if err != nil || got.ID != b.ID {
		t.Fatalf("Remove(leaf) = %s, %v; want %s", got.ID, err, b.ID)
	}
	_, err = s.Get(b.ID)
	wantErr(t, "Get of a removed stage", err, errdefs.ErrNotFound)
	_, err = s.Resolve("b")
	wantErr(t, "Resolve of a removed stage's label", err, errdefs.ErrNotFound)
	if _, err := os.Stat(s.LayerPath(b.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed stage's layer: %v; want it gone", err)
	}
	if _, err := s.Remove(t.Context(), a.ID); err != nil {
		t.Fatalf("Remove(root) after its child: %v", err)
	}
	if l := listIDs(t, s); len(l) != 0 {
		t.Errorf("List = %v; want nothing", l)
	}
	if m := MustCommit(t, s, Req(Layer(t, 1), "b", "")); m.ID != a.ID {
		t.Errorf("the removed content again: %s; want its old id %s", m.ID, a.ID)
	}
}

// testGC checks that GC takes what an interrupted commit left and nothing
// else: not stages, not a transfer directory still in use.
func testGC(t *testing.T, tg Target) {
	if tg.Interrupt == nil {
		t.Skip("the target gives no way to interrupt a commit")
	}
	s := tg.New(t)
	if removed, err := s.GC(t.Context()); err != nil || len(removed) != 0 {
		t.Errorf("GC of a new store = %v, %v; want nothing", removed, err)
	}
	kept := MustCommit(t, s, Req(Layer(t, 1), "kept", ""))
	dir, release, err := s.TempDir()
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	if tg.Age != nil {
		tg.Age(t, s, dir)
	}
	leftover := tg.Interrupt(t, s)
	removed, err := s.GC(t.Context())
	if err != nil || !slices.Equal(removed, []string{leftover}) {
		t.Errorf("GC = %v, %v; want only %s", removed, err, leftover)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Errorf("the transfer directory in use: %v; want it kept", err)
	}
	if m, err := s.Get(kept.ID); err != nil {
		t.Errorf("the stage after GC: %v", err)
	} else if _, err := os.Stat(s.LayerPath(m.ID)); err != nil {
		t.Errorf("the stage's layer after GC: %v", err)
	}
	release()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the transfer directory after release: %v; want it gone", err)
	}
	if removed, err := s.GC(t.Context()); err != nil || len(removed) != 0 {
		t.Errorf("GC again = %v, %v; want nothing", removed, err)
	}
}

// testConcurrent checks commits from several goroutines: distinct ones all
// land, one content under one label lands once for all, and one label for
// several contents goes to exactly one.
func testConcurrent(t *testing.T, s store.Interface) {
	const n = 6
	scratches := make([]string, n)
	for i := range scratches {
		scratches[i] = Layer(t, uint64(i))
	}
	same := Layer(t, 100)
	contested := make([]string, n)
	for i := range contested {
		contested[i] = Layer(t, uint64(200+i))
	}
	type result struct {
		m   store.Meta
		err error
	}
	run := func(req func(i int) store.CommitRequest) []result {
		out := make([]result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				out[i].m, _, out[i].err = s.Commit(t.Context(), req(i))
			})
		}
		wg.Wait()
		return out
	}
	distinct := run(func(i int) store.CommitRequest { return Req(scratches[i], fmt.Sprintf("distinct-%d", i), "") })
	for i, r := range distinct {
		if r.err != nil {
			t.Errorf("distinct commit %d: %v", i, r.err)
		}
	}
	shared := run(func(int) store.CommitRequest { return Req(same, "shared", "") })
	for i, r := range shared {
		if r.err != nil || r.m.ID != shared[0].m.ID {
			t.Errorf("commit %d of one content and label: %s, %v; want %s for all", i, r.m.ID, r.err, shared[0].m.ID)
		}
	}
	won := 0
	for i, r := range run(func(i int) store.CommitRequest { return Req(contested[i], "contested", "") }) {
		switch {
		case r.err == nil:
			won++
		case !errors.Is(r.err, errdefs.ErrAlreadyExists):
			t.Errorf("contested commit %d: %v; want success or already exists", i, r.err)
		}
	}
	if won != 1 {
		t.Errorf("%d commits took one label; want exactly 1", won)
	}
	if l := listIDs(t, s); len(l) != n+2 {
		t.Errorf("%d stages; want %d", len(l), n+2)
	}
}
