package stages

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// Result types of the stage calls. Each is the JSON object the CLI prints
// and the MCP server returns; OK is always first.

// StageEntry describes one stage.
type StageEntry struct {
	ID         string   `json:"stage_id"`
	Name       string   `json:"name"`
	Label      string   `json:"label"`
	Parent     string   `json:"parent,omitempty"`
	Chain      []string `json:"chain"`
	BaseFlavor string   `json:"base"`
	BaseSHA256 string   `json:"base_sha256,omitempty"`
	SizeBytes  int64    `json:"size_bytes"`
	Allocated  int64    `json:"allocated_bytes"`
	Created    string   `json:"created"`
	Argv       []string `json:"argv,omitempty"`
	// Stale is set when the stage's chain was made over another build of
	// its base than the one installed now.
	Stale bool `json:"stale"`
}

type StageListResult struct {
	OK     bool         `json:"ok"`
	Stages []StageEntry `json:"stages"`
}

type StageInfoResult struct {
	OK         bool         `json:"ok"`
	Stage      StageEntry   `json:"stage"`
	Chain      []StageEntry `json:"chain"`       // root first, ending with Stage
	LayerPaths []string     `json:"layer_paths"` // root first
}

type StageRemoveResult struct {
	OK      bool   `json:"ok"`
	Removed string `json:"removed"`
	Label   string `json:"label"`
	Name    string `json:"name"`
}

func stageEntry(m store.Meta) StageEntry {
	return StageEntry{
		ID: m.ID, Name: m.Name, Label: m.Label, Parent: m.Parent, Chain: m.Chain,
		BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256,
		SizeBytes: m.SizeBytes, Allocated: m.AllocatedBytes,
		Created: m.Created.UTC().Format(time.RFC3339), Argv: m.Argv,
	}
}

// stageEntries describes ms in order; never nil.
func stageEntries(ms []store.Meta) []StageEntry {
	out := make([]StageEntry, 0, len(ms))
	for _, m := range ms {
		out = append(out, stageEntry(m))
	}
	return out
}

// markStale marks entries whose chain disagrees with the installed base.
func (s *Service) markStale(st *store.Store, entries []StageEntry) {
	shas := map[string]string{}
	for i := range entries {
		flavor := entries[i].BaseFlavor
		sha, ok := shas[flavor]
		if !ok {
			sha = s.installedSHA(flavor)
			shas[flavor] = sha
		}
		if sha == "" {
			continue
		}
		for _, id := range entries[i].Chain {
			m, err := st.Get(id)
			if err == nil && m.BaseSHA256 != "" && m.BaseSHA256 != sha && !s.haveBaseBuild(m.BaseSHA256) {
				entries[i].Stale = true
			}
		}
	}
}

// StageList lists stages oldest first.
func (s *Service) StageList(ctx context.Context) (*StageListResult, error) {
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	all, err := st.List()
	if err != nil {
		return nil, err
	}
	res := &StageListResult{OK: true, Stages: stageEntries(all)}
	s.markStale(st, res.Stages)
	return res, nil
}

// StageInfo resolves ref and describes the stage and its chain.
func (s *Service) StageInfo(ctx context.Context, ref string) (*StageInfoResult, error) {
	st, chain, err := s.Chain(ref)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("%q is the reserved empty stage: it has no layers: %w", ref, errdefs.ErrInvalidArgument)
	}
	res := &StageInfoResult{OK: true, Chain: stageEntries(chain)}
	for _, c := range chain {
		res.LayerPaths = append(res.LayerPaths, st.LayerPath(c.ID))
	}
	s.markStale(st, res.Chain)
	res.Stage = res.Chain[len(res.Chain)-1]
	return res, nil
}

// StageRemove removes a stage no other stage builds on.
func (s *Service) StageRemove(ctx context.Context, ref string) (*StageRemoveResult, error) {
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	m, err := st.Remove(ctx, ref)
	if err != nil {
		return nil, err
	}
	if s.opts.Removed != nil {
		s.opts.Removed()
	}
	return &StageRemoveResult{OK: true, Removed: m.ID, Label: m.Label, Name: m.Name}, nil
}

// StageLogResult is the chain from the base to a stage.
type StageLogResult struct {
	OK     bool         `json:"ok"`
	Base   string       `json:"base"`
	Layers []StageEntry `json:"layers"` // root first
}

// StageLog lists the chain from the base to ref, each layer with the command
// that produced it, when, and its size.
func (s *Service) StageLog(ctx context.Context, ref string) (*StageLogResult, error) {
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	chain, err := st.Log(ref)
	if err != nil {
		return nil, err
	}
	res := &StageLogResult{OK: true, Layers: stageEntries(chain)}
	if n := len(chain); n > 0 {
		res.Base = chain[n-1].BaseFlavor
	}
	return res, nil
}

// StageDiffResult lists what changed from one stage to another.
type StageDiffResult struct {
	OK      bool          `json:"ok"`
	From    string        `json:"from"`
	To      string        `json:"to"`
	Added   []store.Entry `json:"added"`
	Changed []store.Entry `json:"changed"`
	Removed []store.Entry `json:"removed"`
}

// StageDiff compares the merged layers of two stages, read on the host.
func (s *Service) StageDiff(ctx context.Context, a, b string) (*StageDiffResult, error) {
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	d, err := st.Diff(ctx, a, b)
	if err != nil {
		return nil, err
	}
	nz := func(e []store.Entry) []store.Entry {
		if e == nil {
			return []store.Entry{}
		}
		return e
	}
	return &StageDiffResult{OK: true, From: a, To: b, Added: nz(d.Added), Changed: nz(d.Changed), Removed: nz(d.Removed)}, nil
}
