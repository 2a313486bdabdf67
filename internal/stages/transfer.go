package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sync/singleflight"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/transfer"
)

// Stages travel through OCI registries (internal/transfer): StagePush
// sends a stage, its chain and the base it was made over; StagePull
// brings them back. Both are safe to call from many goroutines; pulls of
// the same source share one transfer, so a server that pulls a stage on
// demand fetches it once however many calls ask for it at the same time.

// StagePushOptions are `isopod stage push`'s flags.
type StagePushOptions struct {
	// WithoutBase leaves the base out; a pull over a host without that
	// build is then refused.
	WithoutBase bool
	Progress    func(Progress)
}

// StagePushResult reports a push.
type StagePushResult struct {
	OK bool `json:"ok"`
	*transfer.PushResult
}

// StagePush pushes the stage ref names, its chain and (unless
// o.WithoutBase) its base to dest, REGISTRY/REPO[:TAG]; the tag defaults
// to the stage's id. Blobs the registry has are not sent again.
func (s *Service) StagePush(ctx context.Context, ref, dest string, o StagePushOptions) (*StagePushResult, error) {
	st, chain, err := s.Chain(ref)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("%q is the empty stage: there is nothing to push: %w", ref, errdefs.ErrInvalidArgument)
	}
	tip := chain[len(chain)-1]
	base, err := image.BaseRecord(s.opts.Paths, tip.BaseFlavor, tip.BaseSHA256)
	if err != nil && !o.WithoutBase {
		return nil, fmt.Errorf("stage %s: %w (push it with --without-base to leave the base out)", tip, err)
	}
	if err != nil {
		base = image.BaseInfo{Flavor: tip.BaseFlavor, ContentSHA256: tip.BaseSHA256}
	}
	c := transfer.Client{Registry: s.registry(), Progress: o.Progress, Logger: s.log}
	res, err := c.PushStage(ctx, transfer.PushRequest{Store: st, Chain: chain, Base: base, WithoutBase: o.WithoutBase, Dest: dest})
	if err != nil {
		return nil, err
	}
	return &StagePushResult{OK: true, PushResult: res}, nil
}

// StagePullOptions are `isopod stage pull`'s flags.
type StagePullOptions struct {
	// As labels the stage here; empty: the label it was pushed with.
	As       string
	Progress func(Progress)
}

// StagePullResult reports a pull.
type StagePullResult struct {
	OK    bool       `json:"ok"`
	Stage StageEntry `json:"stage"`
	*transfer.PullResult
}

// pulls shares concurrent pulls of one source.
var pulls singleflight.Group

// StagePull fetches the stage source names (REGISTRY/REPO:TAG or
// @DIGEST), its chain and, when this host lacks it, its base. Layers
// already here are not fetched again; every layer's id and full digest are
// checked against its bytes. Concurrent pulls of the same source in this
// process share one transfer (their progress goes to the first caller);
// a caller stops waiting for it at its own deadline (unavailable), and the
// transfer goes on for the others. A registry that stalls fails it (see
// oci.Stall).
func (s *Service) StagePull(ctx context.Context, source string, o StagePullOptions) (*StagePullResult, error) {
	ref, err := transfer.PullRef(source)
	if err != nil {
		return nil, err
	}
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	key := s.opts.Paths.Home + "\x00" + ref.Name() + "\x00" + o.As
	// The transfer outlives a caller that gives up, for the others.
	ch := pulls.DoChan(key, func() (any, error) {
		c := transfer.Client{Registry: s.registry(), Progress: o.Progress, Logger: s.log}
		return c.PullStage(context.WithoutCancel(ctx), transfer.PullRequest{
			Store: st, Paths: s.opts.Paths, Ref: ref, As: o.As, AllowBaseSkew: s.opts.AllowBaseSkew,
		})
	})
	var r singleflight.Result
	select {
	case r = <-ch:
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("the pull of %s did not end before the caller's deadline (it goes on for the calls sharing it, "+
				"and keeps what it brings): %w: %w", ref.Name(), ctx.Err(), errdefs.ErrUnavailable)
		}
		return nil, ctx.Err()
	}
	if r.Err != nil {
		return nil, r.Err
	}
	res := r.Val.(*transfer.PullResult)
	m, err := st.Get(res.Stage.ID)
	if err != nil {
		return nil, err
	}
	entry := stageEntry(m)
	entries := []StageEntry{entry}
	s.markStale(st, entries)
	return &StagePullResult{OK: true, Stage: entries[0], PullResult: res}, nil
}

// PullStage is StagePull for a server that fetches a stage a call names
// but this host lacks: repo is REGISTRY/REPO, ref a tag, a stage id (which
// a push tags by default) or a digest.
func (s *Service) PullStage(ctx context.Context, repo, ref string) (*StagePullResult, error) {
	sep := ":"
	if strings.HasPrefix(ref, "sha256:") {
		sep = "@"
	}
	return s.StagePull(ctx, repo+sep+ref, StagePullOptions{})
}
