package image

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

// Flavors are what Build accepts, in the order BuildAll builds them.
var Flavors = []string{FlavorInitramfs, FlavorBaseMin, FlavorBaseDebian}

// BuildResult reports one build.
type BuildResult struct {
	Flavor        string        `json:"flavor"`
	Path          string        `json:"path"`
	Cached        bool          `json:"cached"` // already current; nothing was built
	ContentSHA256 string        `json:"content_sha256"`
	Size          int64         `json:"size"`
	Elapsed       time.Duration `json:"elapsed_ns"`
}

// Build builds one flavor (initramfs, base-min or base-debian).
func Build(ctx context.Context, paths paths.Paths, flavor string, opts BuildOptions) (BuildResult, error) {
	start := time.Now()
	var r BuildResult
	switch flavor {
	case FlavorInitramfs:
		info, err := BuildInitramfs(ctx, paths, opts)
		if err != nil {
			return BuildResult{}, err
		}
		r = BuildResult{Path: info.Path, Cached: info.Cached, ContentSHA256: info.ContentSHA256, Size: info.Size}
	case FlavorBaseMin, FlavorBaseDebian:
		build := BuildBaseMin
		if flavor == FlavorBaseDebian {
			build = BuildBaseDebian
		}
		info, err := build(ctx, paths, opts)
		if err != nil {
			return BuildResult{}, fmt.Errorf("building %s: %w", flavor, err)
		}
		r = BuildResult{Path: info.Path, Cached: info.Cached, ContentSHA256: info.ContentSHA256, Size: info.Size}
	default:
		return BuildResult{}, fmt.Errorf("unknown image %q (known: %s): %w", flavor, strings.Join(Flavors, ", "), errdefs.ErrInvalidArgument)
	}
	r.Flavor, r.Elapsed = flavor, time.Since(start)
	return r, nil
}

// BuildAll builds the initramfs and every base, fetching the pinned kernel
// first when none is installed and no custom kernel is set. It stops at the
// first failure and returns what it built so far.
func BuildAll(ctx context.Context, paths paths.Paths, opts BuildOptions) ([]BuildResult, error) {
	if err := paths.Ensure(); err != nil {
		return nil, err
	}
	if _, err := ResolveKernel(paths, opts.Kernel); errors.Is(err, errdefs.ErrFailedPrecondition) {
		logger(opts.Logger).Info("no guest kernel installed; fetching the pinned one")
		if _, err := FetchKernel(ctx, paths, FetchOptions{Logger: opts.Logger, Apt: opts.Apt}); err != nil {
			return nil, fmt.Errorf("fetching the kernel: %w", err)
		}
	}
	var out []BuildResult
	for _, f := range Flavors {
		r, err := Build(ctx, paths, f, opts)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
