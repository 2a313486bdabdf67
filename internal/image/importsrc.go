package image

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
)

// Transports an import SOURCE may name, as skopeo spells them.
const (
	TransportRegistry      = "docker"
	TransportOCILayout     = "oci"
	TransportDockerArchive = "docker-archive"
)

// otherTransports are skopeo's transports that import does not read.
var otherTransports = []string{"containers-storage", "docker-daemon", "dir", "oci-archive", "ostree", "sif", "tarball"}

// importSource is a parsed SOURCE.
type importSource struct {
	transport string
	ref       name.Reference // registry
	path      string         // OCI layout directory or archive file
	tag       string         // in a layout or archive; may be empty
}

// String is the source in the form import accepts.
func (s importSource) String() string {
	switch s.transport {
	case TransportRegistry:
		return s.ref.Name()
	case TransportOCILayout, TransportDockerArchive:
		if s.tag != "" {
			return s.transport + ":" + s.path + ":" + s.tag
		}
		return s.transport + ":" + s.path
	}
	return s.transport
}

// parseSource reads SOURCE: a registry reference (optionally docker://),
// oci:DIR[:TAG] or docker-archive:FILE[:REF]. As in skopeo, the path ends
// at its first ':'.
func parseSource(src string) (importSource, error) {
	bad := func(why string) error {
		return fmt.Errorf("image source %q: %s: %w", src, why, errdefs.ErrInvalidArgument)
	}
	if t, rest, ok := strings.Cut(src, ":"); ok {
		switch t {
		case TransportOCILayout, TransportDockerArchive:
			p, tag, _ := strings.Cut(rest, ":")
			if p == "" {
				return importSource{}, bad("no path after " + t + ":")
			}
			return importSource{transport: t, path: p, tag: tag}, nil
		case TransportRegistry:
			src = strings.TrimPrefix(rest, "//")
		default:
			for _, o := range otherTransports {
				if t == o {
					return importSource{}, bad("the " + t + " transport is not supported: give a registry reference, oci:DIR[:TAG] or docker-archive:FILE")
				}
			}
		}
	}
	ref, err := name.ParseReference(src)
	if err != nil {
		return importSource{}, bad("not a registry reference (registry/repository:tag or @sha256:...), oci:DIR[:TAG] or docker-archive:FILE: " + err.Error())
	}
	return importSource{transport: TransportRegistry, ref: ref}, nil
}

// sourceImage is the one image an import reads.
type sourceImage struct {
	img v1.Image
	// identity is what the content id derives from: the manifest digest,
	// or for a docker-save archive (whose manifests are made up on
	// reading) "config:" and its config digest.
	identity string
	digest   v1.Hash // the manifest's digest; zero for an archive
	// manifest: the layers have descriptors (digests of what is
	// transferred); false for a docker-save archive.
	manifest bool
}

var linuxAMD64 = v1.Platform{OS: "linux", Architecture: "amd64"}

// open resolves the source to its linux/amd64 image.
func (s importSource) open(ctxOpts []remote.Option) (sourceImage, error) {
	switch s.transport {
	case TransportRegistry:
		desc, err := remote.Get(s.ref, ctxOpts...)
		if err != nil {
			return sourceImage{}, oci.Classify(err, "image "+s.ref.Name())
		}
		switch {
		case desc.MediaType.IsIndex():
			idx, err := desc.ImageIndex()
			if err != nil {
				return sourceImage{}, oci.Classify(err, "image "+s.ref.Name())
			}
			im, err := idx.IndexManifest()
			if err != nil {
				return sourceImage{}, fmt.Errorf("%s: reading the index: %v: %w", s, err, errdefs.ErrInvalidArgument)
			}
			return pickPlatform(im, s.String(), func(d v1.Descriptor) (v1.Image, error) {
				img, err := idx.Image(d.Digest)
				return img, oci.Classify(err, s.String()+" linux/amd64")
			})
		case desc.MediaType.IsSchema1():
			return sourceImage{}, fmt.Errorf("%s is a Docker schema 1 manifest, which import does not read: push it again with a current client: %w", s, errdefs.ErrNotSupported)
		case desc.MediaType.IsImage():
			img, err := desc.Image()
			if err != nil {
				return sourceImage{}, oci.Classify(err, "image "+s.ref.Name())
			}
			return sourceImage{img: img, identity: desc.Digest.String(), digest: desc.Digest, manifest: true}, nil
		}
		return sourceImage{}, notAnImage(s.String(), desc.MediaType)
	case TransportOCILayout:
		return s.openLayout()
	case TransportDockerArchive:
		var tag *name.Tag
		if s.tag != "" {
			t, err := name.NewTag(s.tag)
			if err != nil {
				return sourceImage{}, fmt.Errorf("%s: %q is not an image reference: %w", s, s.tag, errdefs.ErrInvalidArgument)
			}
			tag = &t
		}
		if err := checkArchive(s.path); err != nil {
			return sourceImage{}, err
		}
		img, err := tarball.ImageFromPath(s.path, tag)
		if err != nil {
			return sourceImage{}, fmt.Errorf("reading docker-save archive %s: %v: %w", s.path, err, errdefs.ErrInvalidArgument)
		}
		cfg, err := img.ConfigName()
		if err != nil {
			return sourceImage{}, fmt.Errorf("reading docker-save archive %s: %v: %w", s.path, err, errdefs.ErrInvalidArgument)
		}
		return sourceImage{img: img, identity: "config:" + cfg.String()}, nil
	}
	return sourceImage{}, fmt.Errorf("transport %q: %w", s.transport, errdefs.ErrNotSupported)
}

func notAnImage(src string, mt types.MediaType) error {
	return fmt.Errorf("%s is not a container image (its manifest is %q): %w", src, mt, errdefs.ErrInvalidArgument)
}

// pickPlatform takes the linux/amd64 image of an index, which open
// opens by its descriptor.
func pickPlatform(im *v1.IndexManifest, src string, open func(v1.Descriptor) (v1.Image, error)) (sourceImage, error) {
	var have []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.OS == linuxAMD64.OS && d.Platform.Architecture == linuxAMD64.Architecture && d.MediaType.IsImage() {
			img, err := open(d)
			if err != nil {
				return sourceImage{}, err
			}
			return sourceImage{img: img, identity: d.Digest.String(), digest: d.Digest, manifest: true}, nil
		}
		if d.Platform.OS != "unknown" {
			have = append(have, d.Platform.String())
		}
	}
	return sourceImage{}, fmt.Errorf("%s has no linux/amd64 image (it has %s); isopod's guests are linux/amd64: %w",
		src, strings.Join(have, ", "), errdefs.ErrNotSupported)
}

// readConfig reads the image's config: as the blob m names, through the
// cap and checked against its digest while it streams; from a docker-save
// archive (m nil), whose configs checkArchive has capped and whose config
// digest is the image's identity, as the archive reader gives it.
func (im *importer) readConfig(m *v1.Manifest) ([]byte, error) {
	src := im.src.String()
	if m == nil {
		raw, err := im.si.img.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("%s: its config: %v: %w", src, err, errdefs.ErrInvalidArgument)
		}
		return raw, nil
	}
	what := "config " + m.Config.Digest.String()
	if err := oci.CheckSize(m.Config.Size, what); err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	l, err := im.si.img.LayerByDigest(m.Config.Digest)
	if err != nil {
		return nil, oci.Classify(err, src+": config")
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, oci.Classify(err, src+": config")
	}
	defer rc.Close()
	v, err := oci.NewVerifier(rc, m.Config.Digest, m.Config.Size, what)
	if err != nil {
		return nil, err
	}
	raw, err := oci.ReadCapped(v, what)
	if err != nil {
		return nil, oci.Classify(err, src)
	}
	return raw, nil
}

// checkRaw verifies raw bytes read through get against want.
func checkRaw(get func() ([]byte, error), want v1.Hash, what string) error {
	b, err := get()
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	return oci.CheckBytes(b, want, what)
}
