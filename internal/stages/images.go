package stages

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"isopod/internal/image"
)

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
	st, err := s.Open()
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

// FetchKernelOptions are `isopod image fetch-kernel`'s flags.
type FetchKernelOptions struct {
	FromDeb       string
	AllowUnpinned bool
	Force         bool
}

// FetchKernelResult reports the installed kernel.
type FetchKernelResult struct {
	OK bool `json:"ok"`
	image.KernelInfo
	Path   string `json:"path"`
	Cached bool   `json:"cached"`
}

// FetchKernel installs the pinned guest kernel and its modules.
func (s *Service) FetchKernel(ctx context.Context, o FetchKernelOptions) (*FetchKernelResult, error) {
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	ki, err := image.FetchKernel(ctx, s.opts.Paths, image.FetchOptions{
		FromDeb: o.FromDeb, AllowUnpinned: o.AllowUnpinned, Force: o.Force, Logger: s.log,
	})
	if err != nil {
		return nil, err
	}
	return &FetchKernelResult{OK: true, KernelInfo: ki, Path: filepath.Join(ki.Dir, "vmlinuz"), Cached: ki.Cached}, nil
}

// BuildImagesResult reports image builds.
type BuildImagesResult struct {
	OK     bool                `json:"ok"`
	Images []image.BuildResult `json:"images"`
}

// BuildImages builds the initramfs and the named bases (all when none named).
func (s *Service) BuildImages(ctx context.Context, flavors []string) (*BuildImagesResult, error) {
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	opts := image.BuildOptions{Logger: s.log, Kernel: s.opts.Kernel, AgentBin: s.opts.AgentBin}
	res := &BuildImagesResult{OK: true}
	if len(flavors) == 0 {
		built, err := image.BuildAll(ctx, s.opts.Paths, opts)
		if err != nil {
			return nil, err
		}
		res.Images = built
		return res, nil
	}
	// A named base is useless without a current initramfs: build it first.
	want := append([]string{image.FlavorInitramfs}, flavors...)
	seen := map[string]bool{}
	for _, f := range want {
		if seen[f] {
			continue
		}
		seen[f] = true
		if f == image.FlavorInitramfs {
			if _, err := image.ResolveKernel(s.opts.Paths, opts.Kernel); err != nil {
				if _, ferr := s.FetchKernel(ctx, FetchKernelOptions{}); ferr != nil {
					return nil, ferr
				}
			}
		}
		r, err := image.Build(ctx, s.opts.Paths, f, opts)
		if err != nil {
			return nil, err
		}
		res.Images = append(res.Images, r)
	}
	return res, nil
}

// ImageList lists the bases a run accepts.
func (s *Service) ImageList(ctx context.Context) (*ImageListResult, error) {
	all, err := image.ListImages(s.opts.Paths, s.opts.Kernel, s.opts.AgentBin)
	if err != nil {
		return nil, err
	}
	res := &ImageListResult{OK: true, Images: []ImageEntry{}}
	for _, ii := range all {
		if ii.Flavor == image.FlavorInitramfs {
			// Not a base; but a stale one makes every base unusable.
			if ii.Stale {
				res.Warnings = append(res.Warnings, "the initramfs is stale ("+ii.StaleReason+"): run `isopod image build-all`")
			}
			continue
		}
		e := ImageEntry{
			Flavor: ii.Flavor, Built: ii.Built, Stale: ii.Stale, StaleReason: ii.StaleReason,
			SizeBytes: ii.Size, ContentSHA256: ii.ContentSHA256, Protocol: ii.ProtocolVersion,
			Kind: ii.Kind, Source: ii.Source, Digest: ii.Digest,
		}
		if ii.Built {
			e.Path = ii.Path
		}
		switch {
		case ii.Stale && ii.Kind == image.KindImported:
			e.Hint = "isopod image rm " + ii.Flavor + " && isopod image import " + ii.Source + " --name " + ii.Flavor
		case !ii.Built || ii.Stale:
			e.Hint = "isopod image build " + ii.Flavor
		}
		res.Images = append(res.Images, e)
	}
	return res, nil
}

// ImageEntry describes one base a run accepts.
type ImageEntry struct {
	Flavor        string `json:"base"`
	Built         bool   `json:"built"`
	Stale         bool   `json:"stale"`
	StaleReason   string `json:"stale_reason,omitempty"`
	Path          string `json:"path,omitempty"`
	SizeBytes     int64  `json:"size_bytes,omitempty"`
	ContentSHA256 string `json:"sha256,omitempty"`
	Protocol      int    `json:"protocol_version,omitempty"`
	Hint          string `json:"hint,omitempty"` // how to build it when not built
	// Kind is built (base-min, base-debian), imported (from a container
	// image: Source, Digest) or pulled (a build that came with a stage).
	Kind   string `json:"kind,omitempty"`
	Source string `json:"source,omitempty"`
	Digest string `json:"digest,omitempty"`
}

type ImageListResult struct {
	OK       bool         `json:"ok"`
	Images   []ImageEntry `json:"images"`
	Warnings []string     `json:"warnings,omitempty"`
}
