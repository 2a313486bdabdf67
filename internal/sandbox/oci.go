package sandbox

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
)

// Progress is one report of a long transfer (image import, stage push
// and pull), for a front end to show.
type Progress = oci.Progress

// registry is how the core talks to registries: Docker's credentials from
// the configured directory, nothing stored, and the configured stall
// bounds.
func (s *Service) registry() oci.Client {
	return oci.Client{Keychain: oci.Keychain{Dir: s.opts.DockerConfig}, UserAgent: "isopod/" + s.opts.Version, Stall: s.opts.RegistryStall}
}

// ImageImportOptions are `isopod image import`'s flags.
type ImageImportOptions struct {
	// Name is what runs will call the base (--base); empty: derived from
	// the source.
	Name string
	// MaxBytes caps the image's unpacked files; 0: image.DefaultImportMaxBytes.
	MaxBytes int64
	// Progress, when set, receives the import's progress.
	Progress func(Progress)
}

// ImageImportResult reports an import.
type ImageImportResult struct {
	OK            bool     `json:"ok"`
	Base          string   `json:"base"`
	ContentSHA256 string   `json:"content_sha256"`
	Source        string   `json:"source"`
	Digest        string   `json:"digest,omitempty"`
	Path          string   `json:"path"`
	SizeBytes     int64    `json:"size_bytes"`
	Layers        int      `json:"layers"`
	Cached        bool     `json:"cached"` // already imported; nothing was fetched
	Env           []string `json:"env,omitempty"`
	WorkingDir    string   `json:"working_dir,omitempty"`
	Shell         bool     `json:"shell"`
	// Skipped are entries no base keeps (device nodes, FIFOs).
	Skipped   []string `json:"skipped,omitempty"`
	Notes     []string `json:"notes,omitempty"`
	ElapsedMS int64    `json:"elapsed_ms"`
}

// ImageImport makes a base of a container image: a registry reference,
// oci:DIR[:TAG] or docker-archive:FILE[:REF]. Runs then use it by name.
func (s *Service) ImageImport(ctx context.Context, source string, o ImageImportOptions) (*ImageImportResult, error) {
	start := time.Now()
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	b, err := image.Import(ctx, s.opts.Paths, image.ImportOptions{
		Source: source, Name: o.Name, MaxBytes: o.MaxBytes, Client: s.registry(), Progress: o.Progress, Logger: s.log,
	})
	if err != nil {
		return nil, err
	}
	res := &ImageImportResult{OK: true, Base: b.Name, ContentSHA256: b.ContentSHA256, Path: b.Path,
		SizeBytes: b.Size, Cached: b.Cached, ElapsedMS: time.Since(start).Milliseconds()}
	if im := b.Image; im != nil {
		res.Source, res.Digest, res.Layers = im.Source, im.Digest, len(im.Layers)
		res.Env, res.WorkingDir, res.Shell, res.Skipped = im.Env, im.WorkingDir, im.Shell, im.Skipped
		res.Notes = importNotes(b)
	}
	return res, nil
}

// importNotes says what a run will and will not take from the image.
func importNotes(b image.BaseInfo) []string {
	notes := []string{"Env and WorkingDir are a run's defaults (--env and --cwd win); Entrypoint, Cmd and User are not used: runs execute the command given, as root"}
	if !b.Image.Shell {
		notes = append(notes, "the image has no /bin/sh: give commands as argv (MCP sandbox_run, which runs cmd under /bin/sh -c, refuses this base)")
	}
	if len(b.Image.Skipped) > 0 {
		notes = append(notes, fmt.Sprintf("%d device nodes or FIFOs were not kept (listed in skipped); the guest's /dev is its own", len(b.Image.Skipped)))
	}
	return notes
}

// ImageRemoveResult reports a removed base.
type ImageRemoveResult struct {
	OK            bool   `json:"ok"`
	Removed       string `json:"removed"`
	ContentSHA256 string `json:"content_sha256"`
	FreedBytes    int64  `json:"freed_bytes"`
}

// ImageRemove removes an imported or pulled base (by name or content id).
// It is refused while stages or warm-pool snapshots use it.
func (s *Service) ImageRemove(ctx context.Context, ref string) (*ImageRemoveResult, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	stages, err := st.List()
	if err != nil {
		return nil, err
	}
	b, err := image.RemoveStored(s.opts.Paths, ref, func(b image.BaseInfo) []string {
		var users []string
		for _, m := range stages {
			if m.BaseSHA256 == b.ContentSHA256 {
				users = append(users, "stage "+m.String())
			}
		}
		for _, id := range s.warm.IDs() {
			if m, err := s.warm.Read(id); err == nil && m.Parts.BaseSHA256 == b.ContentSHA256 {
				users = append(users, "warm-pool snapshot "+id+" (`isopod warmpool rm "+id+"`)")
			}
		}
		return users
	})
	if err != nil {
		return nil, err
	}
	name := b.Name
	if name == "" {
		name = b.Flavor
	}
	return &ImageRemoveResult{OK: true, Removed: name, ContentSHA256: b.ContentSHA256, FreedBytes: b.Size}, nil
}

// baseFor finds the base a run boots. A fork boots the build its chain
// was made over when this host has it, as the base called flavor or kept
// by content id (a build pulled with a stage); otherwise the base called
// flavor, which the chain's base check then judges.
func (s *Service) baseFor(flavor string, chain []stageRef) (baseImage, error) {
	named, err := s.lookupBase(flavor)
	if len(chain) == 0 {
		return named, err
	}
	want := chain[len(chain)-1].BaseSHA256
	if (err == nil && named.SHA256 == want) || want == "" {
		return named, err
	}
	if ii, ok := image.LookupBaseBuild(s.opts.Paths, want); ok {
		return baseOf(flavor, ii), nil
	}
	if err != nil {
		return baseImage{}, fmt.Errorf("%w (stage %s was made over build %s, which this host does not have either; `isopod stage pull` brings a stage with its base)",
			err, chain[len(chain)-1].ID, want)
	}
	return named, nil
}

// baseOf is the base a run boots from an image record.
func baseOf(flavor string, ii image.ImageInfo) baseImage {
	return baseImage{Flavor: flavor, Path: ii.Path, SHA256: ii.ContentSHA256, Env: ii.Env, Cwd: ii.WorkingDir, NoShell: ii.NoShell}
}

// checkShell refuses, before boot, a shell command line over a base
// without /bin/sh.
func checkShell(req Request, base baseImage) error {
	if req.Shell && base.NoShell {
		return fmt.Errorf("base %s has no /bin/sh, and this command runs as /bin/sh -c: use a base with a shell, or run the program directly with the isopod CLI: %w",
			base.Flavor, errdefs.ErrInvalidArgument)
	}
	return nil
}

// haveBaseBuild reports whether a base build is kept here by content id
// (pulled with a stage), so that stages made over it still run.
func (s *Service) haveBaseBuild(id string) bool {
	_, ok := image.StoredByID(s.opts.Paths, id)
	return ok
}
