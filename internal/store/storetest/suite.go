// Package storetest is the conformance suite of the stage store's
// contract (store.Interface): the real store and the fake
// (internal/store/storefake) both pass it. It checks behaviour a caller
// sees: commits make immutable stages whose ids derive from their content,
// labels are unique and checked, references resolve, chains keep their
// order and their depth limit, removal spares the layers of other chains,
// GC takes only what interrupted work left, commits race safely, layers
// travel between stores, and errors carry their errdefs class.
package storetest

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"isopod/internal/store"
)

// Test values of a commit's base.
const (
	Flavor   = "base-min"
	SHA      = "1111111111111111111111111111111111111111111111111111111111111111"
	OtherSHA = "2222222222222222222222222222222222222222222222222222222222222222"
)

// layerSize is the apparent size of a test layer.
const layerSize = 1 << 20

// Target is a store implementation under test.
type Target struct {
	// New returns an empty store.
	New func(t *testing.T) store.Interface
	// Interrupt leaves in s what a commit killed before it published
	// leaves behind, old enough for GC to take, and returns the name GC
	// reports removing. Nil skips the GC check.
	Interrupt func(t *testing.T, s store.Interface) string
	// Age makes dir, a temporary directory of s from TempDir, old enough
	// that GC would take it were it not in use. Nil: GC does not look at
	// ages.
	Age func(t *testing.T, s store.Interface, dir string)
}

// Run runs the conformance checks against tg.
func Run(t *testing.T, tg Target) {
	t.Run("Commit", func(t *testing.T) { testCommit(t, tg.New(t)) })
	t.Run("ContentAddressed", func(t *testing.T) { testContentAddressed(t, tg) })
	t.Run("Labels", func(t *testing.T) { testLabels(t, tg.New(t)) })
	t.Run("Resolve", func(t *testing.T) { testResolve(t, tg.New(t)) })
	t.Run("Chains", func(t *testing.T) { testChains(t, tg.New(t)) })
	t.Run("ChainDepth", func(t *testing.T) { testChainDepth(t, tg.New(t)) })
	t.Run("Remove", func(t *testing.T) { testRemove(t, tg.New(t)) })
	t.Run("GC", func(t *testing.T) { testGC(t, tg) })
	t.Run("ConcurrentCommits", func(t *testing.T) { testConcurrent(t, tg.New(t)) })
	t.Run("Receive", func(t *testing.T) { testReceive(t, tg) })
	t.Run("ReceiveRefusals", func(t *testing.T) { testReceiveRefusals(t, tg) })
	t.Run("BlobRecords", func(t *testing.T) { testBlobRecords(t, tg.New(t)) })
}

// Layer writes a sparse test layer whose data derives from seed and
// returns its path.
func Layer(t *testing.T, seed uint64) string {
	t.Helper()
	return writeLayer(t, seed, false)
}

// DenseLayer is Layer with its zeros written out instead of left as holes:
// the same content, stored differently.
func DenseLayer(t *testing.T, seed uint64) string {
	t.Helper()
	return writeLayer(t, seed, true)
}

func writeLayer(t *testing.T, seed uint64, dense bool) string {
	t.Helper()
	buf := make([]byte, layerSize)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 'l'})
	_, _ = r.Read(buf[8192 : 8192+5000])
	_, _ = r.Read(buf[layerSize/2 : layerSize/2+4096])
	p := filepath.Join(t.TempDir(), "scratch.ext4")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; off < layerSize; off += 4096 {
		blk := buf[off : off+4096]
		if dense || !bytes.Equal(blk, make([]byte, 4096)) {
			if _, err := f.WriteAt(blk, int64(off)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Truncate(layerSize); err != nil {
		t.Fatal(err)
	}
	return p
}

// Req is a commit request of scratch as label over parent, made over the
// test base.
func Req(scratch, label, parent string) store.CommitRequest {
	return store.CommitRequest{
		Scratch: scratch, Label: label, Parent: parent,
		BaseFlavor: Flavor, BaseSHA256: SHA, Argv: []string{"sh", "-c", "make deps"},
	}
}

// MustCommit commits req and fails the test on error.
func MustCommit(t *testing.T, s store.Interface, req store.CommitRequest) store.Meta {
	t.Helper()
	m, _, err := s.Commit(t.Context(), req)
	if err != nil {
		t.Fatalf("Commit(%q): %v", req.Label, err)
	}
	return m
}

// wantErr checks that err is of class want.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: error %v; want class %v", what, err, want)
	}
}

// sameMeta checks that got describes the same stage as want, field by
// field.
func sameMeta(t *testing.T, what string, got, want store.Meta) {
	t.Helper()
	if !got.Created.Equal(want.Created) {
		t.Errorf("%s: created %v; want %v", what, got.Created, want.Created)
	}
	got.Created = want.Created
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// ids returns the ids of ms.
func ids(ms []store.Meta) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// listIDs lists s and returns the ids, oldest first.
func listIDs(t *testing.T, s store.Interface) []string {
	t.Helper()
	all, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return ids(all)
}

// readFile returns the bytes of path.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hexOf returns the hex digits of a stage id.
func hexOf(id string) string { return strings.TrimPrefix(id, store.IDPrefix) }
