package transfer

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
	"isopod/internal/paths"
	"isopod/internal/store"
)

// PullRequest is a stage to pull with its chain.
type PullRequest struct {
	Store *store.Store
	Paths paths.Paths
	// Ref is REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:..., as PullRef
	// parsed it: the source is parsed once, by the caller.
	Ref name.Reference
	// As labels the stage here; empty: the label it was pushed with
	// (label@id when that is taken here).
	As string
	// AllowBaseSkew lets a stage whose base cannot be had in, when this
	// host has another build of that base (ISOPOD_ALLOW_BASE_SKEW).
	AllowBaseSkew bool
}

// PullResult reports a pull.
type PullResult struct {
	Ref           string        `json:"ref"`
	Digest        string        `json:"digest"`
	Stage         store.Meta    `json:"-"`
	Layers        []LayerResult `json:"layers"` // root first
	Base          *BaseResult   `json:"base,omitempty"`
	BytesReceived int64         `json:"bytes_received"`
	ElapsedMS     int64         `json:"elapsed_ms"`
	Warnings      []string      `json:"warnings,omitempty"`
}

// PullRef parses a pull source; it must name a tag or a digest.
func PullRef(src string) (name.Reference, error) {
	if _, err := name.NewRepository(src); err == nil {
		return nil, fmt.Errorf("pull source %q names no stage: give REPO:TAG or REPO@DIGEST (a push tags a stage with its id, REPO:st-...): %w",
			src, errdefs.ErrInvalidArgument)
	}
	ref, err := name.ParseReference(src)
	if err != nil {
		return nil, fmt.Errorf("pull source %q: %v: %w", src, err, errdefs.ErrInvalidArgument)
	}
	return ref, nil
}

// PullStage fetches the stage req.Ref names, its chain and, when this
// host lacks it, its base, and publishes them in the store.
func (c Client) PullStage(ctx context.Context, req PullRequest) (*PullResult, error) {
	start := time.Now()
	if req.As != "" {
		if err := store.ValidateLabel(req.As); err != nil {
			return nil, fmt.Errorf("--as: %w", err)
		}
	}
	ref := req.Ref
	if ref == nil {
		return nil, fmt.Errorf("a pull names no source: give REPO:TAG or REPO@DIGEST: %w", errdefs.ErrInvalidArgument)
	}
	repo, opts := ref.Context(), c.Registry.Options(ctx)
	m, digest, err := getManifest(ref, StageArtifactType, StageConfigType, opts)
	if err != nil {
		return nil, err
	}
	cb, err := fetchSmall(repo, m.Config, opts)
	if err != nil {
		return nil, err
	}
	var cfg StageConfig
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("%s: its config: %v: %w", ref.Name(), err, errdefs.ErrInvalidArgument)
	}
	if err := checkConfig(cfg, m); err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Name(), err)
	}
	meter := oci.NewMeter("pull", len(cfg.Chain)+1, 0, c.Progress)
	res := &PullResult{Ref: ref.Name(), Digest: digest.String()}
	if res.Base, res.Warnings, err = c.ensureBase(ctx, req, repo, cfg, meter, opts); err != nil {
		return nil, err
	}
	tmp, release, err := req.Store.TempDir()
	if err != nil {
		return nil, err
	}
	defer release()
	for i, rec := range cfg.Chain {
		meter.Start(fmt.Sprintf("layer %d/%d %s", i+1, len(cfg.Chain), rec.ID))
		tipLabel := i == len(cfg.Chain)-1 && req.As != ""
		label := rec.Label
		if tipLabel {
			label = req.As
		}
		got, lr, err := c.pullLayer(ctx, req.Store, repo, rec, m.Layers[i], label, !tipLabel, filepath.Join(tmp, rec.ID), meter, opts)
		if err != nil {
			return nil, err
		}
		res.Layers = append(res.Layers, lr)
		meter.Finish(!lr.Moved)
		res.Stage = got
	}
	if res.Stage.Label != cfg.Chain[len(cfg.Chain)-1].Label && res.Stage.Label != req.As {
		res.Warnings = append(res.Warnings, fmt.Sprintf("stage %s is labelled %q here (its label %q was taken or it was here already)",
			res.Stage.ID, res.Stage.Label, cfg.Chain[len(cfg.Chain)-1].Label))
	}
	meter.Done()
	res.BytesReceived, res.ElapsedMS = meter.Snapshot().Bytes, time.Since(start).Milliseconds()
	c.log().Info("stage pulled", "ref", res.Ref, "stage", res.Stage.ID, "bytes", res.BytesReceived)
	return res, nil
}

// checkConfig checks a stage config against itself and its manifest
// before anything else is fetched.
func checkConfig(cfg StageConfig, m *v1.Manifest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("not a well-formed isopod stage: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	if cfg.Schema != stageSchema {
		return fmt.Errorf("stage config schema %d; this isopod reads %d: %w", cfg.Schema, stageSchema, errdefs.ErrNotSupported)
	}
	n := len(cfg.Chain)
	switch {
	case n == 0 || n > store.MaxChainDepth:
		return bad("a chain of %d layers", n)
	case len(m.Layers) != n:
		return bad("%d layers for a chain of %d", len(m.Layers), n)
	case cfg.Stage != cfg.Chain[n-1].ID:
		return bad("the tip %s is not the chain's last stage", cfg.Stage)
	}
	parent := ""
	for i, r := range cfg.Chain {
		hexID := strings.TrimPrefix(r.ID, store.IDPrefix)
		switch {
		case !store.IDPattern.MatchString(r.ID):
			return bad("stage id %q", r.ID)
		case r.Parent != parent:
			return bad("stage %s has parent %q, the chain says %q", r.ID, r.Parent, parent)
		case !strings.HasPrefix(r.Digest, store.DigestPrefix+hexID) || len(r.Digest) != len(store.DigestPrefix)+64:
			return bad("stage %s has digest %q, which does not extend its id", r.ID, r.Digest)
		case string(m.Layers[i].MediaType) != StageLayerType || m.Layers[i].Annotations[AnnotationStageID] != r.ID:
			return bad("layer %d is not stage %s's blob", i+1, r.ID)
		}
		parent = r.ID
	}
	return nil
}

// pullLayer makes stage rec present in the store: a stage already there
// is checked against rec's full digest; another is fetched, decoded into
// tmp and received.
func (c Client) pullLayer(ctx context.Context, st *store.Store, repo name.Repository, rec StageRecord, d v1.Descriptor,
	label string, fallback bool, tmp string, meter *oci.Meter, opts []remote.Option) (store.Meta, LayerResult, error) {
	lr := LayerResult{StageID: rec.ID, Digest: d.Digest.String(), Size: d.Size}
	if have, err := st.Get(rec.ID); err == nil {
		got, err := st.LayerDigest(ctx, have)
		if err != nil {
			return store.Meta{}, lr, err
		}
		if got != rec.Digest {
			return store.Meta{}, lr, fmt.Errorf("stage %s is here with digest %s, but %s sends %s: the same id for other bytes; remove one: %w",
				rec.ID, got, repo.Name(), rec.Digest, errdefs.ErrFailedPrecondition)
		}
		return have, lr, nil
	}
	meter.AddTotal(d.Size)
	l, err := remote.Layer(repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return store.Meta{}, lr, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return store.Meta{}, lr, oci.Classify(err, "stage "+rec.ID)
	}
	defer rc.Close()
	v, err := oci.NewVerifier(meter.Reader(rc), d.Digest, d.Size, "stage "+rec.ID+" blob "+d.Digest.String())
	if err != nil {
		return store.Meta{}, lr, err
	}
	zr, err := zstd.NewReader(v, zstd.WithDecoderMaxWindow(64<<20), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return store.Meta{}, lr, err
	}
	defer zr.Close()
	if _, err := store.DecodeLayer(ctx, zr, tmp, store.MaxLayerBytes); err != nil {
		if derr := v.Drain(); derr != nil {
			err = derr // a damaged blob explains a damaged stream
		}
		return store.Meta{}, lr, oci.Classify(err, "stage "+rec.ID)
	}
	if err := v.Drain(); err != nil {
		return store.Meta{}, lr, oci.Classify(err, "stage "+rec.ID)
	}
	m, err := st.Receive(ctx, store.ReceiveRequest{
		Layer: tmp, ID: rec.ID, Digest: rec.Digest, Label: label, LabelFallback: fallback, Parent: rec.Parent,
		BaseFlavor: rec.BaseFlavor, BaseSHA256: rec.BaseSHA256, Argv: rec.Argv, Created: rec.Created,
		IsopodVersion: rec.IsopodVersion,
		Blob:          store.BlobRecord{Digest: d.Digest.String(), Size: d.Size, MediaType: StageLayerType},
	})
	if err != nil {
		return store.Meta{}, lr, err
	}
	lr.Moved = true
	return m, lr, nil
}

// ensureBase makes the chain's base present, fetching it from repo by its
// content id when this host has no build of that id. A base that cannot
// be had is refused, naming it and how to get it; this host's other build
// of it is the base-skew refusal (or, allowed, a warning).
func (c Client) ensureBase(ctx context.Context, req PullRequest, repo name.Repository, cfg StageConfig,
	meter *oci.Meter, opts []remote.Option) (*BaseResult, []string, error) {
	b := cfg.Base
	tip := cfg.Chain[len(cfg.Chain)-1]
	if b.Flavor == "" {
		b.Flavor, b.ContentSHA256 = tip.BaseFlavor, tip.BaseSHA256
	}
	res := &BaseResult{Flavor: b.Flavor, ContentSHA256: b.ContentSHA256, Present: true}
	local, lerr := image.LookupBase(req.Paths, b.Flavor)
	if lerr == nil && local.ContentSHA256 == b.ContentSHA256 {
		return res, nil, nil
	}
	if _, ok := image.StoredByID(req.Paths, b.ContentSHA256); ok {
		return res, nil, nil
	}
	if b.ContentSHA256 != "" {
		got, found, err := c.pullBase(ctx, req.Paths, repo, b.ContentSHA256, meter, opts)
		if err != nil || found {
			return got, nil, err
		}
	}
	if lerr == nil {
		metas := make([]store.Meta, len(cfg.Chain))
		for i, r := range cfg.Chain {
			metas[i] = store.Meta{ID: r.ID, Label: r.Label, BaseFlavor: r.BaseFlavor, BaseSHA256: r.BaseSHA256}
		}
		warns, err := store.CheckBase(metas, b.Flavor, local.ContentSHA256, req.AllowBaseSkew)
		if err != nil {
			return nil, nil, fmt.Errorf("%s does not hold the stage's base (no %s): %w", repo.Name(), BaseTag(repo, b.ContentSHA256).TagStr(), err)
		}
		res.Present = false
		return res, warns, nil
	}
	return nil, nil, missingBase(repo, tip.ID, b)
}

// missingBase refuses a stage whose base this host lacks and the registry
// does not hold, saying how to get it.
func missingBase(repo name.Repository, stage string, b BaseRef) error {
	how := fmt.Sprintf("push the stage again with its base (without --without-base) from a host that has it, or build %s here with `isopod image build %s` "+
		"and remake the stage over it (a build made elsewhere has another content id)", b.Flavor, b.Flavor)
	if b.Kind == image.KindImported {
		src := b.Source
		local := strings.HasPrefix(src, image.TransportOCILayout+":") || strings.HasPrefix(src, image.TransportDockerArchive+":")
		if ref, err := name.ParseReference(src); err == nil && b.Digest != "" && !local {
			src = ref.Context().Name() + "@" + b.Digest
		}
		how = fmt.Sprintf("import the same image (manifest %s) with `isopod image import %s --name %s`, or push the stage again with its base from a host that has it",
			b.Digest, src, b.Flavor)
	}
	return fmt.Errorf("stage %s was made over base %s (content id %s), which this host does not have and %s does not hold (no tag %s): %s: %w",
		stage, b.Flavor, b.ContentSHA256, repo.Name(), BaseTagPrefix+b.ContentSHA256, how, errdefs.ErrFailedPrecondition)
}
