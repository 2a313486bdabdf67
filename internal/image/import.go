package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/oci"
	"isopod/internal/paths"
)

// ImportRecipe is the revision of how a container image becomes a base
// (the unpacking rules, the squashfs options). It is part of every
// imported base's content id; bump it when either changes.
const ImportRecipe = 1

// DefaultImportMaxBytes caps what an image may unpack to, unless the
// caller sets its own cap.
const DefaultImportMaxBytes int64 = 8 << 30

// importMaxEntries caps the tar entries of all layers together.
const importMaxEntries = 2_000_000

// ImageSource describes an imported base's container image: its sidecar
// records it whole.
type ImageSource struct {
	Source    string `json:"source"`
	Transport string `json:"transport"`
	// Digest is the manifest's digest (empty for a docker-save archive,
	// whose manifest is made up on reading).
	Digest string `json:"digest,omitempty"`
	// Identity is what the content id derives from (see
	// ImportedContentID): the manifest digest, or "config:" and the
	// config digest for a docker-save archive.
	Identity     string          `json:"identity"`
	ConfigDigest string          `json:"config_digest"`
	Platform     string          `json:"platform"`
	Layers       []ImageLayer    `json:"layers"`
	Config       json.RawMessage `json:"config"` // the image's config, as it came
	// What runs take from the config: Env and WorkingDir are a run's
	// defaults; Entrypoint, Cmd and User are not used.
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// Shell: /bin/sh is a file in the root.
	Shell bool `json:"shell"`
	// Skipped are the entries no base keeps (device nodes, FIFOs).
	Skipped []string `json:"skipped,omitempty"`
}

// ImageLayer is one layer of an imported image.
type ImageLayer struct {
	Digest    string `json:"digest,omitempty"` // of the blob as transferred
	DiffID    string `json:"diff_id"`          // of the uncompressed tar
	MediaType string `json:"media_type,omitempty"`
	Size      int64  `json:"size,omitempty"`
}

// ImportOptions is one import.
type ImportOptions struct {
	// Source is a registry reference (optionally docker://),
	// oci:DIR[:TAG] or docker-archive:FILE[:REF].
	Source string
	// Name is what runs will call the base; empty: derived from Source.
	Name string
	// MaxBytes caps the image's unpacked files; 0: DefaultImportMaxBytes.
	MaxBytes int64
	Client   oci.Client
	Progress func(oci.Progress)
	Logger   *slog.Logger
}

// Import makes a base of a container image: the linux/amd64 image of
// Source, every blob checked against its digest, its layers applied in
// order into a staging directory under images/, packed into a squashfs
// and published by rename as a stored base. Nothing half-made is left
// under images/ when it fails. The same image already imported under the
// same name is not fetched again.
func Import(ctx context.Context, p paths.Paths, o ImportOptions) (BaseInfo, error) {
	log := logger(o.Logger)
	src, err := parseSource(o.Source)
	if err != nil {
		return BaseInfo{}, err
	}
	if o.Name == "" {
		if o.Name = defaultName(src); ValidBaseName(o.Name) != nil {
			return BaseInfo{}, fmt.Errorf("no usable name derives from %s: give one with --name: %w", src, errdefs.ErrInvalidArgument)
		}
	}
	if err := ValidBaseName(o.Name); err != nil {
		return BaseInfo{}, err
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultImportMaxBytes
	}
	si, err := src.open(o.Client.Options(ctx))
	if err != nil {
		return BaseInfo{}, err
	}
	im := &importer{src: src, si: si, opts: o, log: log}
	if err := im.inspect(); err != nil {
		return BaseInfo{}, err
	}
	id := ImportedContentID(ImportRecipe, si.identity)
	if err := checkNameFree(p, o.Name, id); err != nil {
		return BaseInfo{}, err
	}
	if _, ok := StoredByID(p, id); ok {
		log.Info("image already imported", "base", o.Name, "content_id", id)
		return publishStored(p, "", BaseInfo{Name: o.Name, ContentSHA256: id})
	}
	if err := os.MkdirAll(p.Images(), 0o755); err != nil {
		return BaseInfo{}, fmt.Errorf("creating images directory: %w", err)
	}
	work, err := os.MkdirTemp(p.Images(), ".tmp-import-")
	if err != nil {
		return BaseInfo{}, err
	}
	defer os.RemoveAll(work)
	info, err := im.build(ctx, work, id)
	if err != nil {
		return BaseInfo{}, err
	}
	return publishStored(p, filepath.Join(work, "pub"), info)
}

// importer is one import in progress.
type importer struct {
	src  importSource
	si   sourceImage
	opts ImportOptions
	log  *slog.Logger

	rawConfig    []byte
	configDigest string // the manifest's config digest; empty for an archive
	config       *v1.ConfigFile
	layers       []ImageLayer
	total        int64
}

// inspect reads and checks the manifest and config, before any layer
// moves.
func (im *importer) inspect() error {
	img, src := im.si.img, im.src.String()
	var m *v1.Manifest
	if im.si.manifest {
		if err := checkRaw(img.RawManifest, im.si.digest, "manifest "+im.si.digest.String()); err != nil {
			return err
		}
		var err error
		if m, err = img.Manifest(); err != nil {
			return fmt.Errorf("%s: its manifest: %v: %w", src, err, errdefs.ErrInvalidArgument)
		}
		if m.Config.MediaType != types.DockerConfigJSON && m.Config.MediaType != types.OCIConfigJSON {
			return fmt.Errorf("%s is not a container image: its config is %q: %w", src, m.Config.MediaType, errdefs.ErrInvalidArgument)
		}
		im.configDigest = m.Config.Digest.String()
	}
	raw, err := im.readConfig(m)
	if err != nil {
		return err
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%s: its config is not an image config: %v: %w", src, err, errdefs.ErrInvalidArgument)
	}
	if cf.OS != "" && (cf.OS != linuxAMD64.OS || cf.Architecture != linuxAMD64.Architecture) {
		return fmt.Errorf("%s is a %s/%s image; isopod's guests are linux/amd64: %w", src, cf.OS, cf.Architecture, errdefs.ErrNotSupported)
	}
	im.rawConfig, im.config = raw, cf
	for _, d := range cf.RootFS.DiffIDs {
		im.layers = append(im.layers, ImageLayer{DiffID: d.String()})
	}
	if m == nil {
		return nil
	}
	if len(m.Layers) != len(cf.RootFS.DiffIDs) {
		return fmt.Errorf("%s: the manifest has %d layers and the config %d: %w", src, len(m.Layers), len(cf.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	for i, l := range m.Layers {
		if _, err := layerCodec(l.MediaType); err != nil {
			return fmt.Errorf("%s: layer %d: %w", src, i+1, err)
		}
		im.layers[i].Digest, im.layers[i].MediaType, im.layers[i].Size = l.Digest.String(), string(l.MediaType), l.Size
		im.total += l.Size
	}
	if im.total > im.opts.MaxBytes {
		return fmt.Errorf("%s: its layers are %d MiB compressed, over the cap of %d MiB: raise it with --max-mib: %w",
			src, im.total>>20, im.opts.MaxBytes>>20, errdefs.ErrInvalidArgument)
	}
	return nil
}

// layerCodec says how a layer media type is compressed: "gzip", "zstd" or
// "" (a plain tar).
func layerCodec(mt types.MediaType) (string, error) {
	switch mt {
	case types.DockerLayer, types.OCILayer:
		return "gzip", nil
	case types.OCILayerZStd:
		return "zstd", nil
	case types.OCIUncompressedLayer, types.DockerUncompressedLayer:
		return "", nil
	case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return "", fmt.Errorf("%q is a non-distributable (foreign) layer, which import does not fetch: %w", mt, errdefs.ErrNotSupported)
	}
	return "", fmt.Errorf("unsupported layer media type %q (import reads tar layers, plain, gzip or zstd): %w", mt, errdefs.ErrNotSupported)
}

// build unpacks every layer into work/root and packs work/pub/base.sqfs.
func (im *importer) build(ctx context.Context, work, id string) (BaseInfo, error) {
	start := time.Now()
	root, pub := filepath.Join(work, "root"), filepath.Join(work, "pub")
	for _, d := range []string{root, pub} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return BaseInfo{}, err
		}
	}
	u, err := newUnpacker(root, unpackLimits{MaxBytes: im.opts.MaxBytes, MaxEntries: importMaxEntries})
	if err != nil {
		return BaseInfo{}, err
	}
	ls, err := im.si.img.Layers()
	if err != nil {
		return BaseInfo{}, oci.Classify(err, im.src.String()+": layers")
	}
	if len(ls) != len(im.layers) {
		return BaseInfo{}, fmt.Errorf("%s: %d layers, its config lists %d: %w", im.src, len(ls), len(im.layers), errdefs.ErrInvalidArgument)
	}
	meter := oci.NewMeter("import", len(ls)+1, im.total, im.opts.Progress)
	for i, l := range ls {
		if err := ctx.Err(); err != nil {
			return BaseInfo{}, err
		}
		meter.Start(fmt.Sprintf("layer %d/%d %s", i+1, len(ls), shortDigest(im.layers[i].Digest, im.layers[i].DiffID)))
		if err := im.applyLayer(u, i, l, meter); err != nil {
			return BaseInfo{}, err
		}
		meter.Finish(false)
	}
	meter.Start("packing the squashfs")
	sqfs := filepath.Join(pub, storedSqfs)
	if err := u.pack(ctx, filepath.Join(work, "pseudo"), sqfs); err != nil {
		return BaseInfo{}, err
	}
	meter.Finish(false)
	meter.Done()
	sum, err := sha256File(sqfs)
	if err != nil {
		return BaseInfo{}, err
	}
	fi, err := os.Stat(sqfs)
	if err != nil {
		return BaseInfo{}, err
	}
	if err := os.Chmod(sqfs, 0o644); err != nil {
		return BaseInfo{}, err
	}
	isrc := &ImageSource{
		Source: im.src.String(), Transport: im.src.transport, Identity: im.si.identity,
		Platform: linuxAMD64.String(), Layers: im.layers, Config: im.rawConfig,
		Env: im.config.Config.Env, WorkingDir: im.config.Config.WorkingDir,
		Shell: u.hasShell(), Skipped: u.skipped,
	}
	if im.si.manifest {
		isrc.Digest = im.si.digest.String()
	}
	isrc.ConfigDigest = im.configDigest
	if !im.si.manifest {
		isrc.ConfigDigest = strings.TrimPrefix(im.si.identity, "config:")
	}
	im.log.Info("image unpacked and packed", "source", isrc.Source, "layers", len(ls), "bytes", u.bytes,
		"squashfs", fi.Size(), "skipped", len(u.skipped), "elapsed", time.Since(start).Round(time.Millisecond))
	return BaseInfo{
		Flavor: im.opts.Name, Name: im.opts.Name, Kind: KindImported, Recipe: ImportRecipe,
		ContentSHA256: id, SquashfsSHA256: sum, ProtocolVersion: agentproto.Version,
		BuiltUnix: time.Now().Unix(), Size: fi.Size(), Image: isrc,
	}, nil
}

func shortDigest(ds ...string) string {
	for _, d := range ds {
		if _, hex, ok := strings.Cut(d, ":"); ok && len(hex) >= 12 {
			return d[:len(d)-len(hex)] + hex[:12]
		}
	}
	return ""
}

// applyLayer streams layer i into u, checking the blob against its
// digest, which fixes the tar it unpacks to, or, for a docker-save
// archive's layers, which have no digest of their own, the tar against
// its diff id.
func (im *importer) applyLayer(u *unpacker, i int, l v1.Layer, meter *oci.Meter) error {
	what := fmt.Sprintf("%s: layer %d/%d", im.src, i+1, len(im.layers))
	diffID, err := v1.NewHash(im.layers[i].DiffID)
	if err != nil {
		return fmt.Errorf("%s: diff id %q: %v: %w", what, im.layers[i].DiffID, err, errdefs.ErrInvalidArgument)
	}
	var tarStream io.Reader
	var blob *oci.Verifier
	if im.si.manifest {
		d, _ := v1.NewHash(im.layers[i].Digest)
		rc, err := l.Compressed()
		if err != nil {
			return oci.Classify(err, what)
		}
		defer rc.Close()
		if blob, err = oci.NewVerifier(meter.Reader(rc), d, im.layers[i].Size, what+" ("+d.String()+")"); err != nil {
			return err
		}
		codec, _ := layerCodec(types.MediaType(im.layers[i].MediaType))
		dec, err := decompress(codec, blob)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer dec.Close()
		tarStream = dec
	} else {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrInvalidArgument)
		}
		defer rc.Close()
		tarStream = meter.Reader(rc)
	}
	var diff *oci.Verifier
	if blob == nil {
		if diff, err = oci.NewVerifier(tarStream, diffID, -1, what+" uncompressed ("+diffID.String()+")"); err != nil {
			return err
		}
		tarStream = diff
	}
	if err := u.apply(i, tarStream); err != nil {
		return layerError(blob, what, err)
	}
	if _, err := io.Copy(io.Discard, tarStream); err != nil { // what follows the tar's end
		return layerError(blob, what, err)
	}
	if diff != nil {
		if err := diff.Drain(); err != nil {
			return layerError(blob, what, err)
		}
	}
	if blob != nil {
		if err := blob.Drain(); err != nil {
			return layerError(blob, what, err)
		}
	}
	return nil
}

// layerError prefers a digest mismatch, which explains a broken stream,
// over what broke.
func layerError(blob *oci.Verifier, what string, err error) error {
	var de *oci.DigestError
	if errors.As(err, &de) {
		return err
	}
	if blob != nil {
		if derr := blob.Drain(); errors.As(derr, &de) {
			return derr
		}
	}
	if errdefs.Class(err) != "internal" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

func decompress(codec string, r io.Reader) (io.ReadCloser, error) {
	switch codec {
	case "gzip":
		return kgzip.NewReader(r)
	case "zstd":
		d, err := zstd.NewReader(r)
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return io.NopCloser(r), nil
}

// defaultName derives a base name from a source: the repository's (or
// layout directory's, or archive file's) last element, and its tag when
// it is not latest.
func defaultName(s importSource) string {
	var n, tag string
	switch s.transport {
	case TransportRegistry:
		n = path.Base(s.ref.Context().RepositoryStr())
		if t, ok := s.ref.(interface{ TagStr() string }); ok {
			tag = t.TagStr()
		}
	default:
		n = strings.TrimSuffix(filepath.Base(s.path), filepath.Ext(s.path))
		tag = s.tag
	}
	if tag != "" && tag != "latest" {
		n += "-" + tag
	}
	n = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, n)
	n = strings.TrimLeft(n, ".-_")
	if len(n) > 64 {
		n = n[:64]
	}
	return n
}
