package sandbox

import (
	"context"
	"fmt"

	"isopod/internal/errdefs"
	"isopod/internal/image"
)

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
	return kernelFiles{Kernel: b.Kernel, BzImage: b.BzImage, Initramfs: b.Initramfs}, nil
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
