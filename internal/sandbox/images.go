package sandbox

import (
	"context"
	"fmt"
	"path/filepath"

	"isopod/internal/image"
)

// lookupBase finds the installed build of a base flavor.
func (s *Service) lookupBase(flavor string) (baseImage, error) {
	ii, err := image.LookupBase(s.opts.Paths, flavor)
	if err != nil {
		return baseImage{}, fmt.Errorf("--base %s: %w", flavor, err)
	}
	return baseOf(flavor, ii), nil
}

// resolveBoot picks the guest kernel and its initramfs.
func (s *Service) resolveBoot() (image.Boot, error) {
	return image.ResolveBoot(s.opts.Paths, s.opts.Kernel)
}

// resolveKernel picks the guest kernel and its initramfs.
func (s *Service) resolveKernel(ctx context.Context) (kernelFiles, error) {
	b, err := s.resolveBoot()
	if err != nil {
		return kernelFiles{}, err
	}
	return kernelFiles{Kernel: b.Kernel, Initramfs: b.Initramfs}, nil
}

// prepareScratch gives a run its fresh scratch disk: a sparse copy of a
// pre-made empty ext4 of the requested size.
func (s *Service) prepareScratch(dst string, sizeMiB int) error {
	tmpl, err := image.ScratchTemplate(s.opts.Paths, sizeMiB)
	if err != nil {
		return fmt.Errorf("preparing the scratch disk: %w", err)
	}
	if err := image.CopySparse(dst, tmpl); err != nil {
		return fmt.Errorf("preparing the scratch disk: %w", err)
	}
	return nil
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
