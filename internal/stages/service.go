package stages

import (
	"fmt"
	"log/slog"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
	"isopod/internal/settings"
	"isopod/internal/store"
	"isopod/internal/warmpool"
)

// Options configures a Service: the settings read at the front ends,
// whole, and what the front end itself decides.
type Options struct {
	settings.Settings
	Logger  *slog.Logger // nil: discard
	Version string       // isopod version, recorded in stages
	// Removed, when set, is called after a stage is removed, so that the
	// core's ready VMs holding its layer end now, not at the next run.
	Removed func()
}

// Service is the store's housekeeping both front ends call. It is safe
// for concurrent use.
type Service struct {
	opts Options
	log  *slog.Logger
	warm *warmpool.Catalog
}

// New returns a Service over the state root in opts.Paths.
func New(opts Options) *Service {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{opts: opts, log: log, warm: warmpool.New(opts.Paths, log)}
}

// Progress is one report of a long transfer (image import, stage push
// and pull), for a front end to show.
type Progress = oci.Progress

// Open opens the stage store.
func (s *Service) Open() (*store.Store, error) {
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	return store.Open(s.opts.Paths.Stages(), store.Options{
		LocksDir: s.opts.Paths.Locks(),
		Logger:   s.log,
		Version:  s.opts.Version,
	})
}

// Chain opens the store and resolves ref to its chain of stages, root
// first; the reserved empty stage has an empty chain.
func (s *Service) Chain(ref string) (*store.Store, []store.Meta, error) {
	st, err := s.Open()
	if err != nil {
		return nil, nil, err
	}
	m, err := st.Resolve(ref)
	if err != nil {
		return nil, nil, err
	}
	if m.IsBase() {
		return st, nil, nil
	}
	chain, err := st.Chain(m)
	if err != nil {
		return nil, nil, err
	}
	return st, chain, nil
}

// CheckChainBase refuses a chain of stages (their ids, root first) made
// over another build of the base flavor than sha (store.CheckBase); with
// allowSkew it only warns.
func (s *Service) CheckChainBase(ids []string, flavor, sha string, allowSkew bool) ([]string, error) {
	st, err := s.Open()
	if err != nil {
		return nil, err
	}
	metas := make([]store.Meta, 0, len(ids))
	for _, id := range ids {
		m, err := st.Get(id)
		if err != nil {
			return nil, err
		}
		metas = append(metas, m)
	}
	return store.CheckBase(metas, flavor, sha, allowSkew)
}

// registry is how the store talks to registries: Docker's credentials
// from the configured directory, nothing stored, and the configured stall
// bounds.
func (s *Service) registry() oci.Client {
	return oci.Client{Keychain: oci.Keychain{Dir: s.opts.DockerConfig}, UserAgent: "isopod/" + s.opts.Version, Stall: s.opts.RegistryStall}
}

// installedSHA is the content id of the installed build of a base flavor
// ("" when there is none).
func (s *Service) installedSHA(flavor string) string {
	ii, err := image.LookupBase(s.opts.Paths, flavor)
	if err != nil {
		return ""
	}
	return ii.ContentSHA256
}

// haveBaseBuild reports whether a base build is kept here by content id
// (pulled with a stage), so that stages made over it still run.
func (s *Service) haveBaseBuild(id string) bool {
	_, ok := image.StoredByID(s.opts.Paths, id)
	return ok
}

// CheckLabelFree refuses a run's --commit-as label that is already taken, before
// the run, so that a long setup is not wasted. The label's form was checked
// when the request was normalised.
func (s *Service) CheckLabelFree(label string) error {
	st, err := s.Open()
	if err != nil {
		return err
	}
	all, err := st.List()
	if err != nil {
		return err
	}
	for _, m := range all {
		if m.Label == label {
			return fmt.Errorf("--commit-as %q: the label is taken by stage %s (%s); pick another label or remove it with `isopod stage rm %s`: %w",
				label, m.ID, m.Name, m.ID, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}
