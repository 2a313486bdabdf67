package store

import (
	"context"
	"io"
)

// The store's contract: what the core and a stage transfer call on it.
// [Store] is the implementation; internal/store/storefake is another, for
// fast tests of the core; internal/store/storetest is the suite both pass.
// Diff is not part of it: it reads ext4 layers with debugfs.

// Reader finds stages.
type Reader interface {
	// Get returns the stage with the whole id; a malformed id is
	// errdefs.ErrInvalidArgument, an unknown one errdefs.ErrNotFound.
	Get(id string) (Meta, error)
	// List returns every stage, oldest first.
	List() ([]Meta, error)
	// Resolve finds the stage ref names (see [Match]).
	Resolve(ref string) (Meta, error)
	// Chain returns m's chain, root first, m last; nil for the base.
	Chain(m Meta) ([]Meta, error)
	// Log returns the chain of the stage ref names.
	Log(ref string) ([]Meta, error)
	// LayerPath is where stage id's read-only layer file is.
	LayerPath(id string) string
}

// Writer makes and removes stages.
type Writer interface {
	// CheckCommit checks, without copying anything, that req could be
	// committed now.
	CheckCommit(req CommitRequest) error
	// Commit publishes a scratch layer as an immutable stage.
	Commit(ctx context.Context, req CommitRequest) (Meta, CommitTiming, error)
	// Remove deletes a stage no other stage's chain uses.
	Remove(ctx context.Context, ref string) (Meta, error)
	// GC removes what interrupted commits and removals left, and returns
	// the names of what it removed.
	GC(ctx context.Context) ([]string, error)
}

// Transferer is what pushing and pulling stages needs.
type Transferer interface {
	// TempDir makes a directory for layers in transit, left alone by GC
	// until release, which removes it.
	TempDir() (dir string, release func(), err error)
	// LayerDigest returns m's full digest.
	LayerDigest(ctx context.Context, m Meta) (string, error)
	// EncodeLayer writes stage id's layer as a sparse layer stream.
	EncodeLayer(ctx context.Context, id string, w io.Writer) error
	// Receive publishes a layer from elsewhere under the id it hashes to.
	Receive(ctx context.Context, req ReceiveRequest) (Meta, error)
	// BlobRecord and SetBlobRecord keep how a layer was packed.
	BlobRecord(id string) (BlobRecord, bool)
	SetBlobRecord(id string, r BlobRecord) error
}

// Interface is the whole contract.
type Interface interface {
	Reader
	Writer
	Transferer
}

var _ Interface = (*Store)(nil)
