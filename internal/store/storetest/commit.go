package storetest

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// testCommit checks what a commit makes: a stage whose meta says where it
// came from, found again by Get and List, whose layer is a read-only copy
// that later writes to the scratch layer do not reach.
func testCommit(t *testing.T, s store.Interface) {
	scratch := Layer(t, 1)
	want := readFile(t, scratch)
	m := MustCommit(t, s, Req(scratch, "proj/deps", ""))

	if !store.IDPattern.MatchString(m.ID) {
		t.Errorf("id %q does not match %v", m.ID, store.IDPattern)
	}
	if !strings.HasPrefix(m.Digest, store.DigestPrefix+hexOf(m.ID)) || len(m.Digest) != len(store.DigestPrefix)+64 {
		t.Errorf("digest %q: want %s and 64 hex digits, starting with the id's", m.Digest, store.DigestPrefix)
	}
	if m.Name == "" || m.Name == m.Label || m.Label != "proj/deps" {
		t.Errorf("name %q, label %q; want a vanity name and the label given", m.Name, m.Label)
	}
	if m.Parent != "" || !slices.Equal(m.Chain, []string{m.ID}) {
		t.Errorf("parent %q, chain %v; want none and itself", m.Parent, m.Chain)
	}
	if m.BaseFlavor != Flavor || m.BaseSHA256 != SHA || !slices.Equal(m.Argv, Req("", "", "").Argv) {
		t.Errorf("base %q %q, argv %q; want the request's", m.BaseFlavor, m.BaseSHA256, m.Argv)
	}
	if m.SizeBytes != layerSize || m.Created.IsZero() || m.IsBase() {
		t.Errorf("size %d, created %v; want %d and a time", m.SizeBytes, m.Created, layerSize)
	}
	got, err := s.Get(m.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	sameMeta(t, "Get after Commit", got, m)
	if l := listIDs(t, s); !slices.Equal(l, []string{m.ID}) {
		t.Errorf("List = %v; want the one stage", l)
	}

	layer := s.LayerPath(m.ID)
	if st, err := os.Stat(layer); err != nil || st.Mode().Perm()&0o222 != 0 {
		t.Errorf("layer %s: %v, %v; want a read-only file", layer, st, err)
	}
	if err := os.WriteFile(scratch, bytes.Repeat([]byte("x"), 9000), 0o644); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, layer), want) {
		t.Error("the layer changed with the scratch file after the commit; want a copy")
	}
}

// testContentAddressed checks that a stage's id follows from its content,
// parent and base flavor only: not from how the layer is stored, nor the
// store, nor the label; and that one content has one label.
func testContentAddressed(t *testing.T, tg Target) {
	s := tg.New(t)
	a := MustCommit(t, s, Req(Layer(t, 1), "a", ""))

	again := MustCommit(t, s, Req(DenseLayer(t, 1), "a", ""))
	if again.ID != a.ID || again.Name != a.Name {
		t.Errorf("the same content with zeros written out: %s (%s); want the existing %s (%s)", again.ID, again.Name, a.ID, a.Name)
	}
	_, _, err := s.Commit(t.Context(), Req(Layer(t, 1), "b", ""))
	wantErr(t, "the same content under another label", err, errdefs.ErrAlreadyExists)
	if l := listIDs(t, s); len(l) != 1 {
		t.Errorf("List = %v after committing one content three times; want one stage", l)
	}
	if o := MustCommit(t, tg.New(t), Req(Layer(t, 1), "elsewhere", "")); o.ID != a.ID || o.Digest != a.Digest {
		t.Errorf("the same content in another store: %s %s; want %s %s", o.ID, o.Digest, a.ID, a.Digest)
	}

	other := Req(Layer(t, 1), "other-flavor", "")
	other.BaseFlavor = "base-debian"
	differ := map[string]store.Meta{
		"other content":       MustCommit(t, s, Req(Layer(t, 2), "other-content", "")),
		"another parent":      MustCommit(t, s, Req(Layer(t, 1), "over-a", a.ID)),
		"another base flavor": MustCommit(t, s, other),
	}
	seen := map[string]string{a.ID: "the first"}
	for what, m := range differ {
		if prev, ok := seen[m.ID]; ok {
			t.Errorf("%s: id %s, the same as %s", what, m.ID, prev)
		}
		seen[m.ID] = what
	}
}

// testLabels checks that labels are validated and unique, as labels and
// against vanity names, by Commit and CheckCommit alike.
func testLabels(t *testing.T, s store.Interface) {
	first := MustCommit(t, s, Req(Layer(t, 1), "first", ""))
	scratch := Layer(t, 2)
	bad := map[string]string{
		"empty":         "",
		"flag-like":     "-x",
		"reserved":      store.BaseRef,
		"id-like":       "st-0123456789abcdef",
		"unprintable":   "a\x00b",
		"padded":        " lead",
		"invalid UTF-8": "a\xffb",
		"too long":      strings.Repeat("l", store.MaxLabelBytes+1),
	}
	for what, label := range bad {
		_, _, err := s.Commit(t.Context(), Req(scratch, label, ""))
		wantErr(t, "Commit with a label "+what, err, errdefs.ErrInvalidArgument)
		wantErr(t, "CheckCommit with a label "+what, s.CheckCommit(Req(scratch, label, "")), errdefs.ErrInvalidArgument)
	}
	for what, label := range map[string]string{"taken": first.Label, "another stage's name": first.Name} {
		_, _, err := s.Commit(t.Context(), Req(scratch, label, ""))
		wantErr(t, "Commit with a label "+what, err, errdefs.ErrAlreadyExists)
		wantErr(t, "CheckCommit with a label "+what, s.CheckCommit(Req(scratch, label, "")), errdefs.ErrAlreadyExists)
	}
	noScratch, noFlavor := Req("", "free", ""), Req(scratch, "free", "")
	noFlavor.BaseFlavor = ""
	for what, req := range map[string]store.CommitRequest{"no scratch layer": noScratch, "no base flavor": noFlavor} {
		_, _, err := s.Commit(t.Context(), req)
		wantErr(t, "Commit with "+what, err, errdefs.ErrInvalidArgument)
	}
	if err := s.CheckCommit(Req(scratch, "myproj/deps", "")); err != nil {
		t.Errorf("CheckCommit with a free label: %v", err)
	}
	if l := listIDs(t, s); !slices.Equal(l, []string{first.ID}) {
		t.Errorf("List = %v after refused commits and checks; want only %s", l, first.ID)
	}
	if m := MustCommit(t, s, Req(scratch, "myproj/deps", "")); m.Label != "myproj/deps" {
		t.Errorf("label %q; want myproj/deps", m.Label)
	}
}

// testResolve checks every way a reference names a stage, and the classes
// of the ways it fails to.
func testResolve(t *testing.T, s store.Interface) {
	a := MustCommit(t, s, Req(Layer(t, 1), "proj/a", ""))
	b := MustCommit(t, s, Req(Layer(t, 2), "proj/b", a.ID))
	other := MustCommit(t, s, Req(Layer(t, 3), "other", ""))
	if l := listIDs(t, s); !slices.Equal(l, []string{a.ID, b.ID, other.ID}) {
		t.Errorf("List = %v; want oldest first %v", l, []string{a.ID, b.ID, other.ID})
	}
	found := map[string]store.Meta{
		b.ID: b, other.Name: other, "proj/a": a, "oth": other, "proj/b": b,
		hexOf(a.ID)[:store.MinIDPrefix]:                        a,
		store.IDPrefix + hexOf(other.ID)[:store.MinIDPrefix+2]: other,
	}
	for ref, want := range found {
		if m, err := s.Resolve(ref); err != nil || m.ID != want.ID {
			t.Errorf("Resolve(%q) = %s, %v; want %s", ref, m.ID, err, want.ID)
		}
	}
	if m, err := s.Resolve(store.BaseRef); err != nil || !m.IsBase() {
		t.Errorf("Resolve(base) = %+v, %v; want the empty stage", m, err)
	}
	refused := map[string]error{
		"":                    errdefs.ErrInvalidArgument,
		"proj/":               errdefs.ErrInvalidArgument, // two labels start so
		"st-ab":               errdefs.ErrInvalidArgument, // too short for an id prefix
		"nothing":             errdefs.ErrNotFound,
		"st-ffffffffffffffff": errdefs.ErrNotFound,
	}
	for ref, want := range refused {
		_, err := s.Resolve(ref)
		wantErr(t, "Resolve("+ref+")", err, want)
	}
	_, err := s.Get("proj/a")
	wantErr(t, "Get of a label", err, errdefs.ErrInvalidArgument)
	_, err = s.Get("st-ffffffffffffffff")
	wantErr(t, "Get of an unknown id", err, errdefs.ErrNotFound)
	if m, err := s.Get(a.ID); err != nil || m.Label != a.Label {
		t.Errorf("Get(%s) = %v, %v", a.ID, m, err)
	}
}
