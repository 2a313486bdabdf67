package mcpserver

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/store"
)

// Stages on demand. With a stage registry (--stage-registry REGISTRY/REPO),
// a sandbox_run naming a stage this host lacks pulls it first (its chain
// and, when missing, its base) through the core's stage transfer, once
// however many calls ask at the same time; with --push-commits, a stage a
// call commits is pushed there, tagged with its id and with its label
// (labelTag). Any host sharing the registry can then serve any call.
//
// A stage is found in the registry by its full id (st-..., the tag every
// push carries) or by a label (the tag a push from this server adds). A
// label's tag names the stage last pushed under that label; ids are exact.

// stageTransfer is the core's optional ability to move stages through an
// OCI registry; the stage store (*stages.Service) has it.
type stageTransfer interface {
	PullStage(ctx context.Context, repo, ref string) (*stages.StagePullResult, error)
	StagePush(ctx context.Context, ref, dest string, o stages.StagePushOptions) (*stages.StagePushResult, error)
}

var _ stageTransfer = (*stages.Service)(nil)

// RegistryResult says what a call moved through the stage registry.
type RegistryResult struct {
	// Pulled is the reference the forked stage was pulled from, when this
	// host lacked it; PullShared when the call waited for another call's
	// pull of it.
	Pulled     string `json:"pulled,omitempty"`
	PullMS     *int64 `json:"pull_ms,omitempty"`
	PullShared bool   `json:"pull_shared,omitempty"`
	// Pushed are the references the committed stage was pushed to.
	Pushed    []string `json:"pushed,omitempty"`
	PushError string   `json:"push_error,omitempty"`
}

// registryTag is the tag a stage reference is found under: a full stage
// id as it is; anything else but an id prefix is taken for a label
// (labelTag). A name is not in the registry: looked for as a label, it is
// not found.
func registryTag(ref string) (string, bool) {
	switch {
	case store.IDPattern.MatchString(ref):
		return ref, true
	case strings.HasPrefix(ref, store.IDPrefix):
		return "", false
	}
	return labelTag(ref), true
}

// labelTag is the OCI tag of a label: "label-", the label with every
// character a tag cannot hold made '-', cut to 64, then "-" and 16 hex
// digits of its SHA-256, so that two labels never share a tag.
func labelTag(label string) string {
	slug := []byte(label)
	for i, c := range slug {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			slug[i] = '-'
		}
	}
	s := strings.Trim(string(slug), ".-")
	if len(s) > 64 {
		s = s[:64]
	}
	sum := sha256.Sum256([]byte(label))
	return "label-" + s + "-" + hex.EncodeToString(sum[:8])
}

// flights runs one pull per key; later callers wait for it.
type flights struct {
	mu sync.Mutex // guards following
	m  map[string]*flight
}

type flight struct {
	done   chan struct{}
	id     string
	pulled bool
	err    error
}

// do runs fn for key unless it runs already; shared says the caller
// waited for another's.
func (f *flights) do(ctx context.Context, key string, fn func() (string, bool, error)) (id string, pulled, shared bool, err error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	fl, ok := f.m[key]
	if !ok {
		fl = &flight{done: make(chan struct{})}
		f.m[key] = fl
		go func() {
			fl.id, fl.pulled, fl.err = fn()
			f.mu.Lock()
			delete(f.m, key)
			f.mu.Unlock()
			close(fl.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-fl.done:
		return fl.id, fl.pulled, ok, fl.err
	case <-ctx.Done():
		return "", false, ok, ctx.Err()
	}
}

// ensureStage pulls the stage r forks when this host lacks it and the
// registry has it, and points r at it by id: the reference is resolved
// once, here, and the run forks the stage found (a label that moves
// meanwhile does not change it). The pull counts against the call's
// timeout_s: a call stops waiting for it at that deadline (the pull goes
// on for the others that wait, and the stage it brings stays), and the
// run gets what is left.
func (s *Server) ensureStage(ctx context.Context, r *sandbox.Request, st *runStatus) (*RegistryResult, error) {
	tr, ok := s.cfg.Core.(stageTransfer)
	if s.cfg.StageRegistry == "" || !ok || r.Stage == "" || r.Stage == sandbox.BaseStage {
		return nil, nil
	}
	info, err := s.cfg.Core.StageInfo(ctx, r.Stage)
	if err == nil {
		r.Stage = info.Stage.ID
		return nil, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil // unreadable: the run says why
	}
	tag, ok := registryTag(r.Stage)
	if !ok {
		return nil, nil
	}
	ref := s.cfg.StageRegistry + ":" + tag
	st.setPhase("pulling stage " + r.Stage + " from " + ref)
	defer st.setPhase("")
	t0 := time.Now()
	budget := time.Duration(cmp.Or(r.TimeoutS, sandbox.DefaultTimeoutS)) * time.Second
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	want := r.Stage
	id, pulled, shared, err := s.pulls.do(wctx, ref, func() (string, bool, error) {
		// A pull that ended just before this one began has published it.
		if info, err := s.cfg.Core.StageInfo(s.life, want); err == nil {
			return info.Stage.ID, false, nil
		}
		res, err := tr.PullStage(s.life, s.cfg.StageRegistry, tag)
		if err != nil {
			return "", false, err
		}
		s.log.Info("stage pulled", "stage", res.Stage.ID, "ref", ref, "bytes", res.BytesReceived, "ms", res.ElapsedMS)
		return res.Stage.ID, true, nil
	})
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, fmt.Errorf("stage %q is not on this host, and its pull from %s did not finish within timeout_s (%s): "+
			"the pull goes on, and a call made after it ends finds the stage here; call again later, or raise timeout_s: %w",
			want, ref, budget, errdefs.ErrUnavailable)
	}
	if err != nil {
		return nil, fmt.Errorf("stage %q is not on this host, and pulling it from %s failed: %w", want, ref, err)
	}
	r.Stage = id
	r.TimeoutS = max(1, int(math.Ceil((budget - time.Since(t0)).Seconds())))
	if !pulled {
		return nil, nil
	}
	ms := time.Since(t0).Milliseconds()
	return &RegistryResult{Pulled: ref, PullMS: &ms, PullShared: shared}, nil
}

// pushTimeout bounds a commit's push.
const pushTimeout = 30 * time.Minute

// pushCommit pushes a committed stage to the registry, by id and under
// its label's tag. A push that fails is said in the result; the run and
// its commit stand.
func (s *Server) pushCommit(ctx context.Context, rep *report.Run, label string, reg *RegistryResult, st *runStatus) *RegistryResult {
	tr, ok := s.cfg.Core.(stageTransfer)
	if !s.cfg.PushCommits || !ok || rep.StageID == "" {
		return reg
	}
	if reg == nil {
		reg = &RegistryResult{}
	}
	st.setPhase("pushing stage " + rep.StageID + " to " + s.cfg.StageRegistry)
	defer st.setPhase("")
	// The push outlives a client that went away: other hosts want it.
	pctx, cancel := context.WithTimeout(s.life, pushTimeout)
	defer cancel()
	for _, dest := range []string{s.cfg.StageRegistry + ":" + labelTag(label), s.cfg.StageRegistry + ":" + rep.StageID} {
		res, err := tr.StagePush(pctx, rep.StageID, dest, stages.StagePushOptions{})
		if err != nil {
			reg.PushError = mcpWords.Replace(plain(err))
			s.log.Warn("pushing a committed stage failed", "stage", rep.StageID, "dest", dest, "err", err)
			break
		}
		reg.Pushed = append(reg.Pushed, res.Ref)
	}
	return reg
}
