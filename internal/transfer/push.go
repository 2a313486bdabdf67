package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
	"isopod/internal/store"
)

// PushRequest is a stage to push with its chain.
type PushRequest struct {
	Store *store.Store
	Chain []store.Meta // root first; the last is the stage pushed
	// Base is the build the chain was made over (Path set). It is pushed
	// unless WithoutBase; its name and id go in the config either way.
	Base        image.BaseInfo
	WithoutBase bool
	// Dest is REGISTRY/REPO[:TAG]; the tag defaults to the stage's id.
	Dest string
}

// PushResult reports a push.
type PushResult struct {
	Ref       string        `json:"ref"`
	Digest    string        `json:"digest"` // the stage manifest's
	StageID   string        `json:"stage_id"`
	Layers    []LayerResult `json:"layers"` // root first
	Base      *BaseResult   `json:"base,omitempty"`
	BytesSent int64         `json:"bytes_sent"`
	ElapsedMS int64         `json:"elapsed_ms"`
}

// pushRef is where a push goes: dest, tagged with tip when it names no
// tag.
func pushRef(dest, tip string) (name.Tag, error) {
	if repo, err := name.NewRepository(dest); err == nil {
		return repo.Tag(tip), nil
	}
	t, err := name.NewTag(dest)
	if err != nil {
		return name.Tag{}, fmt.Errorf("push destination %q: give REGISTRY/REPOSITORY[:TAG]: %w", dest, errdefs.ErrInvalidArgument)
	}
	return t, nil
}

// PushStage pushes req's chain, and unless told not to its base, to
// req.Dest. Blobs the registry has are not sent again.
func (c Client) PushStage(ctx context.Context, req PushRequest) (*PushResult, error) {
	start := time.Now()
	if len(req.Chain) == 0 {
		return nil, fmt.Errorf("push: the empty stage %q has nothing to push: %w", store.BaseRef, errdefs.ErrInvalidArgument)
	}
	tip := req.Chain[len(req.Chain)-1]
	ref, err := pushRef(req.Dest, tip.ID)
	if err != nil {
		return nil, err
	}
	repo, opts := ref.Context(), c.Registry.Options(ctx)
	items := len(req.Chain) + 1
	if !req.WithoutBase {
		items++
	}
	meter := oci.NewMeter("push", items, 0, c.Progress)
	res := &PushResult{Ref: ref.Name(), StageID: tip.ID}
	if !req.WithoutBase {
		meter.Start("base " + req.Base.Flavor)
		br, err := c.pushBase(ctx, repo, req.Base, meter, opts)
		if err != nil {
			return nil, err
		}
		res.Base = br
		meter.Finish(!br.Moved)
	}
	tmp, release, err := req.Store.TempDir()
	if err != nil {
		return nil, err
	}
	defer release()
	cfg := StageConfig{Schema: stageSchema, Stage: tip.ID, Base: baseRefOf(req.Base)}
	var layers []v1.Descriptor
	for i, m := range req.Chain {
		meter.Start(fmt.Sprintf("layer %d/%d %s", i+1, len(req.Chain), m.ID))
		rec, lr, err := c.pushLayer(ctx, req.Store, repo, m, filepath.Join(tmp, m.ID), meter, opts)
		if err != nil {
			return nil, err
		}
		res.Layers = append(res.Layers, lr)
		meter.Finish(!lr.Moved)
		digest, err := req.Store.LayerDigest(ctx, m)
		if err != nil {
			return nil, err
		}
		cfg.Chain = append(cfg.Chain, StageRecord{
			ID: m.ID, Digest: digest, Label: m.Label, Parent: m.Parent, BaseFlavor: m.BaseFlavor,
			BaseSHA256: m.BaseSHA256, SizeBytes: m.SizeBytes, Created: m.Created, Argv: m.Argv, IsopodVersion: m.IsopodVersion,
		})
		d, _ := v1.NewHash(rec.Digest)
		layers = append(layers, v1.Descriptor{MediaType: StageLayerType, Digest: d, Size: rec.Size,
			Annotations: map[string]string{AnnotationStageID: m.ID}})
	}
	meter.Start("manifest " + ref.Name())
	cb, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cl := static.NewLayer(cb, StageConfigType)
	if err := remote.WriteLayer(repo, cl, opts...); err != nil {
		return nil, oci.Classify(err, "pushing the stage config to "+repo.Name())
	}
	cd, _ := cl.Digest()
	digest, err := putManifest(ref, v1.Manifest{
		ArtifactType: StageArtifactType,
		Config:       v1.Descriptor{MediaType: StageConfigType, Digest: cd, Size: int64(len(cb))},
		Layers:       layers,
		Annotations:  map[string]string{AnnotationStageID: tip.ID, "org.opencontainers.image.created": tip.Created.UTC().Format(time.RFC3339)},
	}, opts)
	if err != nil {
		return nil, err
	}
	meter.Finish(false)
	meter.Done()
	res.Digest, res.BytesSent, res.ElapsedMS = digest.String(), meter.Snapshot().Bytes, time.Since(start).Milliseconds()
	c.log().Info("stage pushed", "ref", res.Ref, "digest", res.Digest, "bytes", res.BytesSent)
	return res, nil
}

// baseRefOf names a base in a stage config.
func baseRefOf(b image.BaseInfo) BaseRef {
	r := BaseRef{Flavor: b.Flavor, ContentSHA256: b.ContentSHA256, Kind: b.Kind}
	if r.Kind == "" {
		r.Kind = image.KindBuilt
	}
	if b.Name != "" {
		r.Flavor = b.Name
	}
	if b.Image != nil {
		r.Source, r.Digest = b.Image.Source, b.Image.Digest
	}
	return r
}

// pushLayer sends one stage's layer blob unless the registry has it. A
// layer is packed only when its blob record is missing or names a blob
// the registry lacks.
func (c Client) pushLayer(ctx context.Context, st *store.Store, repo name.Repository, m store.Meta, tmp string,
	meter *oci.Meter, opts []remote.Option) (store.BlobRecord, LayerResult, error) {
	rec, ok := st.BlobRecord(m.ID)
	if ok {
		d, err := v1.NewHash(rec.Digest)
		if err == nil && rec.MediaType == StageLayerType {
			have, err := blobExists(ctx, repo, d, opts)
			if err != nil {
				return rec, LayerResult{}, err
			}
			if have {
				return rec, LayerResult{StageID: m.ID, Digest: rec.Digest, Size: rec.Size}, nil
			}
		}
	}
	rec, err := packLayer(ctx, st, m.ID, tmp)
	if err != nil {
		return rec, LayerResult{}, err
	}
	defer os.Remove(tmp)
	if err := st.SetBlobRecord(m.ID, rec); err != nil {
		c.log().Warn("could not record a layer's blob; the next push packs it again", "stage", m.ID, "err", err)
	}
	lr := LayerResult{StageID: m.ID, Digest: rec.Digest, Size: rec.Size}
	d, _ := v1.NewHash(rec.Digest)
	have, err := blobExists(ctx, repo, d, opts)
	if err != nil || have {
		return rec, lr, err
	}
	meter.AddTotal(rec.Size)
	if err := remote.WriteLayer(repo, fileBlob{path: tmp, digest: d, size: rec.Size, mt: StageLayerType, meter: meter}, opts...); err != nil {
		return rec, lr, oci.Classify(err, fmt.Sprintf("pushing stage %s to %s", m.ID, repo.Name()))
	}
	lr.Moved = true
	return rec, lr, nil
}

// packLayer writes stage id's layer as a zstd-compressed sparse layer
// stream to path and returns its blob record. The encoder is
// single-threaded, so the same layer packs to the same blob.
func packLayer(ctx context.Context, st *store.Store, id, path string) (store.BlobRecord, error) {
	f, err := os.Create(path)
	if err != nil {
		return store.BlobRecord{}, err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return store.BlobRecord{}, err
	}
	if err := st.EncodeLayer(ctx, id, zw); err != nil {
		zw.Close()
		return store.BlobRecord{}, err
	}
	if err := zw.Close(); err != nil {
		return store.BlobRecord{}, fmt.Errorf("compressing stage %s: %w", id, err)
	}
	if err := f.Close(); err != nil {
		return store.BlobRecord{}, err
	}
	return store.BlobRecord{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: cw.n, MediaType: StageLayerType}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
