package transfer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
	"isopod/internal/paths"
)

// maxBaseBytes bounds a pulled base's squashfs.
const maxBaseBytes = 64 << 30

// pushBase pushes base as repo:base-<content id>, unless that tag is there.
func (c Client) pushBase(ctx context.Context, repo name.Repository, b image.BaseInfo, meter *oci.Meter, opts []remote.Option) (*BaseResult, error) {
	tag := BaseTag(repo, b.ContentSHA256)
	res := &BaseResult{Flavor: baseRefOf(b).Flavor, ContentSHA256: b.ContentSHA256, Ref: tag.Name(), Size: b.Size}
	if b.ContentSHA256 == "" || b.Path == "" {
		return nil, fmt.Errorf("base %s has no content id to push it by: rebuild it, or push with --without-base: %w", b.Flavor, errdefs.ErrFailedPrecondition)
	}
	if _, err := remote.Head(tag, opts...); err == nil {
		return res, nil
	} else if !oci.IsNotFound(err) {
		return nil, oci.Classify(err, "base "+tag.Name())
	}
	sum := b.SquashfsSHA256
	if sum == "" {
		sum = b.ContentSHA256 // a base built here is named by its squashfs's digest
	}
	d, err := v1.NewHash("sha256:" + sum)
	if err != nil {
		return nil, fmt.Errorf("base %s: %w", b.Flavor, err)
	}
	have, err := blobExists(ctx, repo, d, opts)
	if err != nil {
		return nil, err
	}
	if !have {
		meter.AddTotal(b.Size)
		if err := remote.WriteLayer(repo, fileBlob{path: b.Path, digest: d, size: b.Size, mt: BaseLayerType, meter: meter}, opts...); err != nil {
			return nil, oci.Classify(err, "pushing base "+b.Flavor+" to "+repo.Name())
		}
		res.Moved = true
	}
	rec := b
	rec.Name, rec.PulledFrom = "", ""
	if rec.Kind == "" {
		rec.Kind = image.KindBuilt
	}
	if b.Name != "" {
		rec.Flavor = b.Name
	}
	cb, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	cl := static.NewLayer(cb, BaseConfigType)
	if err := remote.WriteLayer(repo, cl, opts...); err != nil {
		return nil, oci.Classify(err, "pushing base "+b.Flavor+" to "+repo.Name())
	}
	cd, _ := cl.Digest()
	_, err = putManifest(tag, v1.Manifest{
		ArtifactType: BaseArtifactType,
		Config:       v1.Descriptor{MediaType: BaseConfigType, Digest: cd, Size: int64(len(cb))},
		Layers:       []v1.Descriptor{{MediaType: BaseLayerType, Digest: d, Size: b.Size}},
	}, opts)
	if err != nil {
		return nil, err
	}
	c.log().Info("base pushed", "ref", tag.Name(), "moved", res.Moved)
	return res, nil
}

// pullBase fetches the base with content id id from repo and stores it.
// found is false when repo holds no such base.
func (c Client) pullBase(ctx context.Context, p paths.Paths, repo name.Repository, id string, meter *oci.Meter, opts []remote.Option) (*BaseResult, bool, error) {
	tag := BaseTag(repo, id)
	m, _, err := getManifest(tag, BaseArtifactType, BaseConfigType, opts)
	if err != nil {
		if oci.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	cb, err := fetchSmall(repo, m.Config, opts)
	if err != nil {
		return nil, true, err
	}
	var info image.BaseInfo
	if err := json.Unmarshal(cb, &info); err != nil {
		return nil, true, fmt.Errorf("%s: its record: %v: %w", tag.Name(), err, errdefs.ErrInvalidArgument)
	}
	if len(m.Layers) != 1 || string(m.Layers[0].MediaType) != BaseLayerType || m.Layers[0].Size <= 0 || m.Layers[0].Size > maxBaseBytes {
		return nil, true, fmt.Errorf("%s: not one squashfs of at most %d bytes: %w", tag.Name(), int64(maxBaseBytes), errdefs.ErrInvalidArgument)
	}
	blob := m.Layers[0]
	if err := checkBaseIdentity(info, id, blob.Digest); err != nil {
		return nil, true, fmt.Errorf("%s: %w", tag.Name(), err)
	}
	res := &BaseResult{Flavor: info.Flavor, ContentSHA256: id, Ref: tag.Name(), Size: blob.Size, Moved: true}
	meter.AddTotal(blob.Size)
	meter.Start("base " + info.Flavor)
	if err := os.MkdirAll(p.Images(), 0o755); err != nil {
		return nil, true, err
	}
	dir, err := os.MkdirTemp(p.Images(), ".tmp-pull-")
	if err != nil {
		return nil, true, err
	}
	defer os.RemoveAll(dir)
	if err := fetchBlob(repo, blob, filepath.Join(dir, "base.sqfs"), meter, opts); err != nil {
		return nil, true, err
	}
	info.Size = blob.Size
	if _, err := image.InstallPulled(p, dir, info, repo.Name()); err != nil {
		return nil, true, err
	}
	meter.Finish(false)
	return res, true, nil
}

// checkBaseIdentity checks that a pulled base record and squashfs digest
// are the base with content id id: a build's id is its squashfs's
// digest; an imported base's derives from its image's manifest.
func checkBaseIdentity(info image.BaseInfo, id string, blob v1.Hash) error {
	if info.ContentSHA256 != id {
		return fmt.Errorf("the record is of base %s, not %s: %w", info.ContentSHA256, id, errdefs.ErrFailedPrecondition)
	}
	switch info.Kind {
	case image.KindImported:
		if info.Image == nil || image.ImportedContentID(info.Recipe, info.Image.Identity) != id || info.SquashfsSHA256 != blob.Hex {
			return fmt.Errorf("an imported base whose record does not derive content id %s: %w", id, errdefs.ErrFailedPrecondition)
		}
	default:
		if blob.Hex != id {
			return &oci.DigestError{What: "base " + info.Flavor, Want: "sha256:" + id, Got: blob.String()}
		}
	}
	return nil
}

// fetchBlob downloads blob d of repo to path, checking its digest.
func fetchBlob(repo name.Repository, d v1.Descriptor, path string, meter *oci.Meter, opts []remote.Option) error {
	l, err := remote.Layer(repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return oci.Classify(err, "blob "+d.Digest.String())
	}
	defer rc.Close()
	v, err := oci.NewVerifier(meter.Reader(rc), d.Digest, d.Size, "blob "+d.Digest.String())
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = v.Drain()
	}
	if err != nil {
		return oci.Classify(err, "fetching "+d.Digest.String())
	}
	return nil
}
