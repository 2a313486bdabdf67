package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/machine"
	"isopod/internal/store"
)

// MaxChainDepth caps a stage chain (each layer is one virtio disk).
const MaxChainDepth = store.MaxChainDepth

// baseImage is the base a run boots over.
type baseImage struct {
	Flavor string
	Path   string
	SHA256 string
	// An imported base's run defaults (Env before the run's, WorkingDir
	// when the run names none), and whether it lacks /bin/sh.
	Env     []string
	Cwd     string
	NoShell bool
}

// kernelFiles is the kernel and initramfs a run boots.
type kernelFiles struct {
	Kernel    string
	BzImage   string
	Initramfs string
}

// plan is everything resolved before a VM starts.
type plan struct {
	base       baseImage
	kernel     kernelFiles
	stage      *stageRef  // nil for the base stage
	layers     []string   // layer paths, root first
	chain      []stageRef // root first
	scratchMiB int
	env        []string
	cwd        string // the working directory when the request names none
	warnings   []string
}

// stageRef is what a run needs to know of one stage.
type stageRef struct {
	ID         string
	Name       string
	Label      string
	BaseFlavor string
	BaseSHA256 string
	Layer      string
}

// planRun resolves the stage chain, the base and the kernel, and checks them
// against each other.
func (s *Service) planRun(ctx context.Context, req Request) (*plan, error) {
	pl := &plan{scratchMiB: req.ScratchMiB}
	if pl.scratchMiB == 0 {
		pl.scratchMiB = DefaultScratchMiB
	}
	flavor := req.Base
	if req.Stage != BaseStage {
		f, err := s.planChain(pl, req)
		if err != nil {
			return nil, err
		}
		if f != "" {
			flavor = f
		}
	}
	var base baseImage
	var err error
	if flavor == "" {
		base, pl.warnings, err = s.defaultBase(req.DefaultBase)
	} else {
		base, err = s.baseFor(flavor, pl.chain)
	}
	if err != nil {
		return nil, err
	}
	if err := checkShell(req, base); err != nil {
		return nil, err
	}
	pl.base, pl.env, pl.cwd = base, base.Env, base.Cwd
	if len(pl.chain) > 0 {
		ids := make([]string, len(pl.chain))
		for i, c := range pl.chain {
			ids[i] = c.ID
		}
		warns, err := s.store.CheckChainBase(ids, base.Flavor, base.SHA256, s.opts.AllowBaseSkew)
		if err != nil {
			return nil, err
		}
		pl.warnings = append(pl.warnings, warns...)
	}
	if req.CommitAs != "" {
		if err := s.store.CheckLabelFree(req.CommitAs); err != nil {
			return nil, err
		}
	}
	k, err := s.resolveKernel(ctx)
	if err != nil {
		return nil, err
	}
	pl.kernel = k
	// The VMM driver and its jail are checked now: a host that cannot
	// confine the VMM refuses the run before anything starts.
	if _, err := s.driver(ctx); err != nil {
		return nil, err
	}
	return pl, nil
}

// defaultBase is the base of a run from the empty stage that names none:
// preferred, the front end's default (empty: DefaultBase), or, when that
// is not usable here (not built, or stale) but DefaultBase is, DefaultBase
// with a warning that names the command that builds preferred. When
// neither is usable, the error is preferred's, which names that command.
func (s *Service) defaultBase(preferred string) (baseImage, []string, error) {
	if preferred == "" {
		preferred = DefaultBase
	}
	b, err := s.lookupBase(preferred)
	if err == nil || preferred == DefaultBase || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		return b, nil, err
	}
	fallback, ferr := s.lookupBase(DefaultBase)
	if ferr != nil {
		return baseImage{}, nil, err
	}
	why := "is not built"
	if _, serr := os.Stat(image.BasePath(s.opts.Paths, preferred)); serr == nil {
		why = "is stale"
	}
	s.log.Info("default base not usable; using the fallback", "base", preferred, "fallback", DefaultBase, "err", err)
	return fallback, []string{fmt.Sprintf("no base was named and the default base %s %s on this host, so this run used %s (busybox only); "+
		"to run on %s, build it on the host: isopod image build %s", preferred, why, DefaultBase, preferred, preferred)}, nil
}

// planChain resolves a forked stage's chain into pl and returns the chain's
// base flavor ("" when ref names the empty base stage).
func (s *Service) planChain(pl *plan, req Request) (string, error) {
	chain, err := s.resolveChain(req.Stage)
	if err != nil {
		return "", fmt.Errorf("--stage %s: %w", req.Stage, err)
	}
	if len(chain) == 0 {
		return "", nil
	}
	pl.chain = chain
	tip := chain[len(chain)-1]
	pl.stage = &tip
	if req.Base != "" && req.Base != tip.BaseFlavor {
		return "", fmt.Errorf("--base %s disagrees with stage %s, which was built on %s; a chain keeps one base: drop --base or fork a stage built on %s: %w",
			req.Base, tip.Label, tip.BaseFlavor, req.Base, errdefs.ErrInvalidArgument)
	}
	for _, st := range chain {
		pl.layers = append(pl.layers, st.Layer)
	}
	if req.CommitAs != "" && len(chain)+1 > MaxChainDepth {
		return "", fmt.Errorf("committing on %s would make a chain of %d layers; the limit is %d: flatten it by redoing the setup in one run from --stage base: %w",
			tip.Label, len(chain)+1, MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	return tip.BaseFlavor, nil
}

// cmdline is the guest kernel command line.
func (pl *plan) cmdline(hostname string) string { return machine.Cmdline(hostname) }

// disks are the run's disks: the base, the layers (root first), and the
// scratch and workspace files given.
func (pl *plan) disks(scratch, workspace, workspaceUpper string) machine.Disks {
	return machine.Disks{Base: pl.base.Path, Layers: pl.layers, Scratch: scratch,
		Workspace: workspace, WorkspaceUpper: workspaceUpper}
}
