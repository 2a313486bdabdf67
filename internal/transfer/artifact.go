// Package transfer moves stages, and the bases they were made over,
// through OCI registries.
//
// A stage travels as an OCI artifact: one manifest whose config is the
// stage metadata of its whole chain (StageConfig) and whose layers are the
// chain's layers, root first, one blob each (a sparse layer stream, see
// store.EncodeLayer, compressed with zstd: holes are not sent). A base
// travels as an artifact of its own, tagged base-<content id> in the same
// repository, so that a pull finds a missing base by its content id: its
// config is the base's record (image.BaseInfo), its one layer the
// squashfs as it is.
//
// Blobs the other side already has are not sent: a push asks the registry
// first, a pull skips stages the store has. Everything that arrives is
// checked: blobs against their sha256 digests, each stage's layer against
// its full digest and its id recomputed from the bytes, a base against its
// content id.
package transfer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
)

// Media types of isopod's artifacts.
const (
	StageArtifactType = "application/vnd.isopod.stage.v1"
	StageConfigType   = "application/vnd.isopod.stage.config.v1+json"
	StageLayerType    = "application/vnd.isopod.stage.layer.v1.sparse+zstd"
	BaseArtifactType  = "application/vnd.isopod.base.v1"
	BaseConfigType    = "application/vnd.isopod.base.config.v1+json"
	BaseLayerType     = "application/vnd.isopod.base.v1.squashfs"

	// AnnotationStageID names the stage a layer blob is.
	AnnotationStageID = "isopod.stage.id"
	// BaseTagPrefix and a content id tag a base artifact.
	BaseTagPrefix = "base-"

	stageSchema = 1
)

// StageConfig is a stage artifact's config.
type StageConfig struct {
	Schema int           `json:"schema"`
	Stage  string        `json:"stage"` // the tip's id
	Chain  []StageRecord `json:"chain"` // root first, one per layer
	Base   BaseRef       `json:"base"`
}

// StageRecord is what travels of one stage's metadata.
type StageRecord struct {
	ID            string    `json:"id"`
	Digest        string    `json:"digest"` // the full digest the id starts
	Label         string    `json:"label"`
	Parent        string    `json:"parent,omitempty"`
	BaseFlavor    string    `json:"base_flavor"`
	BaseSHA256    string    `json:"base_sha256"`
	SizeBytes     int64     `json:"size_bytes"`
	Created       time.Time `json:"created"`
	Argv          []string  `json:"argv,omitempty"`
	IsopodVersion string    `json:"isopod_version,omitempty"`
}

// BaseRef names the base a stage was made over.
type BaseRef struct {
	Flavor        string `json:"flavor"`
	ContentSHA256 string `json:"content_sha256"`
	Kind          string `json:"kind,omitempty"`   // built or imported
	Source        string `json:"source,omitempty"` // an imported base's source
	Digest        string `json:"digest,omitempty"` // and its manifest digest
}

// LayerResult reports one blob of a transfer.
type LayerResult struct {
	StageID string `json:"stage_id,omitempty"`
	Digest  string `json:"digest,omitempty"`
	Size    int64  `json:"size"`
	// Moved: the blob crossed the wire; false when the other side had it.
	Moved bool `json:"moved"`
}

// BaseResult reports the base of a transfer.
type BaseResult struct {
	Flavor        string `json:"base"`
	ContentSHA256 string `json:"content_sha256"`
	Ref           string `json:"ref,omitempty"`
	Size          int64  `json:"size,omitempty"`
	Moved         bool   `json:"moved"`
	// Present: the receiving host already had it.
	Present bool `json:"present"`
}

// Client moves artifacts. The zero value is usable (anonymous, no
// progress, no logs).
type Client struct {
	Registry oci.Client
	Progress func(oci.Progress)
	Logger   *slog.Logger
}

func (c Client) log() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// BaseTag is the tag of the base artifact with content id id in repo.
func BaseTag(repo name.Repository, id string) name.Tag {
	return repo.Tag(BaseTagPrefix + id)
}

// rawManifest is a manifest to put as it is.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.b, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// fileBlob is a blob in a file, counted into a meter as it is read.
type fileBlob struct {
	path   string
	digest v1.Hash
	size   int64
	mt     types.MediaType
	meter  *oci.Meter
}

func (f fileBlob) Digest() (v1.Hash, error)             { return f.digest, nil }
func (f fileBlob) DiffID() (v1.Hash, error)             { return f.digest, nil }
func (f fileBlob) Size() (int64, error)                 { return f.size, nil }
func (f fileBlob) MediaType() (types.MediaType, error)  { return f.mt, nil }
func (f fileBlob) Uncompressed() (io.ReadCloser, error) { return f.Compressed() }
func (f fileBlob) Compressed() (io.ReadCloser, error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{f.meter.Reader(fh), fh}, nil
}

// blobExists asks the registry whether repo has the blob d.
func blobExists(ctx context.Context, repo name.Repository, d v1.Hash, opts []remote.Option) (bool, error) {
	l, err := remote.Layer(repo.Digest(d.String()), opts...)
	if err != nil {
		return false, err
	}
	if _, err := l.Size(); err != nil {
		if oci.IsNotFound(err) {
			return false, nil
		}
		return false, oci.Classify(err, "blob "+d.String()+" in "+repo.Name())
	}
	return true, nil
}

// fetchSmall fetches a small blob (a config) and checks its size and
// digest.
func fetchSmall(repo name.Repository, d v1.Descriptor, opts []remote.Option) ([]byte, error) {
	if err := oci.CheckSize(d.Size, "config "+d.Digest.String()); err != nil {
		return nil, err
	}
	l, err := remote.Layer(repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, oci.Classify(err, "config "+d.Digest.String())
	}
	defer rc.Close()
	v, err := oci.NewVerifier(rc, d.Digest, d.Size, "config "+d.Digest.String())
	if err != nil {
		return nil, err
	}
	b, err := oci.ReadCapped(v, "config "+d.Digest.String())
	if err != nil {
		return nil, oci.Classify(err, "config "+d.Digest.String())
	}
	return b, nil
}

// getManifest fetches the artifact manifest ref names and checks that it
// is of artifactType (its config media type configType).
func getManifest(ref name.Reference, artifactType, configType string, opts []remote.Option) (*v1.Manifest, v1.Hash, error) {
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, v1.Hash{}, oci.Classify(err, ref.Name())
	}
	var m v1.Manifest
	if !desc.MediaType.IsImage() || json.Unmarshal(desc.Manifest, &m) != nil {
		return nil, v1.Hash{}, fmt.Errorf("%s is not an isopod artifact (its manifest is %q): %w", ref.Name(), desc.MediaType, errdefs.ErrInvalidArgument)
	}
	if m.ArtifactType != artifactType && string(m.Config.MediaType) != configType {
		what := m.ArtifactType
		if what == "" {
			what = string(m.Config.MediaType)
		}
		return nil, v1.Hash{}, fmt.Errorf("%s is not an isopod %s (it is %q): %w", ref.Name(),
			strings.TrimSuffix(strings.TrimPrefix(artifactType, "application/vnd.isopod."), ".v1"), what, errdefs.ErrInvalidArgument)
	}
	return &m, desc.Digest, nil
}

// putManifest puts an artifact manifest at ref and returns its digest.
func putManifest(ref name.Reference, m v1.Manifest, opts []remote.Option) (v1.Hash, error) {
	m.SchemaVersion, m.MediaType = 2, types.OCIManifestSchema1
	b, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Put(ref, rawManifest{b, types.OCIManifestSchema1}, opts...); err != nil {
		return v1.Hash{}, oci.Classify(err, "putting "+ref.Name())
	}
	h, _, err := v1.SHA256(strings.NewReader(string(b)))
	return h, err
}
