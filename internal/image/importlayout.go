package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
)

// An OCI image layout is read here rather than by go-containerregistry's
// layout package, which reads every index and manifest file whole: each
// is read through oci.MaxManifestBytes and checked against its digest
// before it is parsed, and layers stream from their files.

// openLayout finds the tagged manifest of an OCI image layout; with no
// tag, the layout's only one.
func (s importSource) openLayout() (sourceImage, error) {
	raw, err := readLayoutFile(filepath.Join(s.path, "index.json"), "index.json of OCI layout "+s.path)
	if err != nil {
		return sourceImage{}, err
	}
	var im v1.IndexManifest
	if err := json.Unmarshal(raw, &im); err != nil {
		return sourceImage{}, fmt.Errorf("reading OCI layout %s: index.json: %v: %w", s.path, err, errdefs.ErrInvalidArgument)
	}
	var found []v1.Descriptor
	var tags []string
	for _, d := range im.Manifests {
		t := d.Annotations["org.opencontainers.image.ref.name"]
		if t != "" {
			tags = append(tags, t)
		}
		if s.tag == "" || t == s.tag {
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 0 && s.tag != "":
		return sourceImage{}, fmt.Errorf("OCI layout %s has no image tagged %q (tags: %s): %w", s.path, s.tag, strings.Join(tags, ", "), errdefs.ErrNotFound)
	case len(found) == 0:
		return sourceImage{}, fmt.Errorf("OCI layout %s holds no image: %w", s.path, errdefs.ErrNotFound)
	case len(found) > 1:
		return sourceImage{}, fmt.Errorf("OCI layout %s holds %d images: name one, oci:%s:TAG (tags: %s): %w",
			s.path, len(found), s.path, strings.Join(tags, ", "), errdefs.ErrInvalidArgument)
	}
	d := found[0]
	switch {
	case d.MediaType.IsIndex():
		raw, err := readLayoutBlob(s.path, d, "index "+d.Digest.String())
		if err != nil {
			return sourceImage{}, err
		}
		var child v1.IndexManifest
		if err := json.Unmarshal(raw, &child); err != nil {
			return sourceImage{}, fmt.Errorf("reading OCI layout %s: index %s: %v: %w", s.path, d.Digest, err, errdefs.ErrInvalidArgument)
		}
		return pickPlatform(&child, s.String(), func(d v1.Descriptor) (v1.Image, error) { return layoutImage(s.path, d) })
	case d.MediaType.IsImage():
		img, err := layoutImage(s.path, d)
		if err != nil {
			return sourceImage{}, err
		}
		return sourceImage{img: img, identity: d.Digest.String(), digest: d.Digest, manifest: true}, nil
	}
	return sourceImage{}, notAnImage(s.String(), d.MediaType)
}

// layoutImage is the image whose manifest d names in the layout at dir.
func layoutImage(dir string, d v1.Descriptor) (v1.Image, error) {
	raw, err := readLayoutBlob(dir, d, "manifest "+d.Digest.String())
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout %s: manifest %s: %v: %w", dir, d.Digest, err, errdefs.ErrInvalidArgument)
	}
	mt := d.MediaType
	if m.MediaType != "" {
		mt = m.MediaType
	}
	return partial.CompressedToImage(&layoutCore{dir: dir, raw: raw, m: m, mt: mt})
}

// readLayoutBlob reads the index, manifest or config d names from the
// layout's blobs, through the cap, and checks it against its digest.
func readLayoutBlob(dir string, d v1.Descriptor, what string) ([]byte, error) {
	if err := oci.CheckSize(d.Size, what); err != nil {
		return nil, err
	}
	b, err := readLayoutFile(blobPath(dir, d.Digest), what)
	if err != nil {
		return nil, err
	}
	if err := oci.CheckBytes(b, d.Digest, what); err != nil {
		return nil, err
	}
	return b, nil
}

// readLayoutFile reads a layout's file through the cap.
func readLayoutFile(path, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	b, err := oci.ReadCapped(f, what)
	if err != nil {
		if errdefs.Class(err) == "internal" {
			err = fmt.Errorf("reading %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
		}
		return nil, err
	}
	return b, nil
}

func blobPath(dir string, h v1.Hash) string {
	return filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
}

// layoutCore is an image of a layout, for partial.CompressedToImage.
type layoutCore struct {
	dir string
	raw []byte
	m   *v1.Manifest
	mt  types.MediaType
}

func (c *layoutCore) RawManifest() ([]byte, error)        { return c.raw, nil }
func (c *layoutCore) MediaType() (types.MediaType, error) { return c.mt, nil }
func (c *layoutCore) RawConfigFile() ([]byte, error) {
	return readLayoutBlob(c.dir, c.m.Config, "config "+c.m.Config.Digest.String())
}

func (c *layoutCore) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == c.m.Config.Digest {
		return layoutBlob{c.dir, c.m.Config}, nil
	}
	for _, d := range c.m.Layers {
		if d.Digest == h {
			return layoutBlob{c.dir, d}, nil
		}
	}
	return nil, fmt.Errorf("OCI layout %s: the manifest has no blob %s: %w", c.dir, h, errdefs.ErrInvalidArgument)
}

// layoutBlob is one blob of a layout, streamed from its file; whoever
// reads it checks its digest.
type layoutBlob struct {
	dir string
	d   v1.Descriptor
}

func (b layoutBlob) Digest() (v1.Hash, error)            { return b.d.Digest, nil }
func (b layoutBlob) Size() (int64, error)                { return b.d.Size, nil }
func (b layoutBlob) MediaType() (types.MediaType, error) { return b.d.MediaType, nil }
func (b layoutBlob) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(blobPath(b.dir, b.d.Digest))
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: blob %s: %v: %w", b.dir, b.d.Digest, err, errdefs.ErrInvalidArgument)
	}
	return f, nil
}
