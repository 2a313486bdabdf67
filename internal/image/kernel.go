package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
	"isopod/internal/knobs"
	"isopod/internal/paths"
)

// FetchOptions tunes FetchKernel.
type FetchOptions struct {
	// FromDeb installs from a local .deb instead of downloading with apt.
	FromDeb string
	// AllowUnpinned accepts a kernel other than KernelPin: the newest cloud
	// kernel apt offers, or a FromDeb file with any digest.
	AllowUnpinned bool
	// Force re-extracts even when the kernel is already present.
	Force bool
	// Modules overrides GuestModules (their dependencies are added).
	Modules []string
	Logger  *slog.Logger
	// Apt runs apt-get and apt-cache; nil finds them with hosttool.Find.
	Apt *Apt
}

// KernelInfo is kernels/<version>/kernel.json.
type KernelInfo struct {
	Package       string `json:"package"`
	Version       string `json:"version"`
	KernelRelease string `json:"kernel_release"`
	SHA256        string `json:"sha256"`
	Pinned        bool   `json:"pinned"`
	FetchedUnix   int64  `json:"fetched_unix"`
	// Modules are the extracted modules in load order, relative to
	// /lib/modules/<kernel_release>.
	Modules []string `json:"modules"`

	Dir    string `json:"-"` // kernels/<version>
	Cached bool   `json:"-"` // already present; nothing was fetched
}

// kernelSource is what FetchKernel decided to install.
type kernelSource struct {
	pkg, version, sha string
	deb               string // local file, when already known
	pinned            bool
}

// FetchKernel installs the guest kernel and its modules under kernels/.
func FetchKernel(ctx context.Context, paths paths.Paths, opts FetchOptions) (KernelInfo, error) {
	log := logger(opts.Logger)
	if err := os.MkdirAll(paths.Kernels(), 0o755); err != nil {
		return KernelInfo{}, fmt.Errorf("creating kernels directory: %w", err)
	}
	src, err := chooseKernel(ctx, opts, log)
	if err != nil {
		return KernelInfo{}, err
	}
	if strings.ContainsAny(src.version, "/\x00") || src.version == "" || src.version[0] == '.' {
		return KernelInfo{}, fmt.Errorf("kernel package version %q is not usable as a directory name: %w", src.version, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Join(paths.Kernels(), src.version)
	if !opts.Force {
		if ki, err := readKernelInfo(dir); err == nil && ki.SHA256 == src.sha {
			ki.Cached = true
			log.Info("kernel already present", "version", ki.Version, "dir", dir)
			return ki, nil
		}
	}
	if src.deb == "" {
		tmp, err := os.MkdirTemp(paths.Kernels(), ".download-")
		if err != nil {
			return KernelInfo{}, fmt.Errorf("creating download directory: %w", err)
		}
		defer os.RemoveAll(tmp)
		os.Chmod(tmp, 0o755)
		log.Info("downloading kernel package", "package", src.pkg, "version", src.version)
		deb, err := opts.Apt.Download(ctx, tmp, src.pkg, src.version)
		if err != nil {
			return KernelInfo{}, explainDownload(err, src)
		}
		if err := verifyDigest(deb, src.sha); err != nil {
			return KernelInfo{}, err
		}
		src.deb = deb
	}
	mods := opts.Modules
	if mods == nil {
		mods = GuestModules
	}
	unlock, err := lock(paths, "kernels")
	if err != nil {
		return KernelInfo{}, err
	}
	defer unlock()
	if !opts.Force {
		if ki, err := readKernelInfo(dir); err == nil && ki.SHA256 == src.sha {
			ki.Cached = true // installed by a concurrent fetch
			return ki, nil
		}
	}
	ki := KernelInfo{Package: src.pkg, Version: src.version, SHA256: src.sha, Pinned: src.pinned, FetchedUnix: time.Now().Unix(), Dir: dir}
	if err := installKernel(src.deb, dir, mods, &ki, log); err != nil {
		return KernelInfo{}, err
	}
	log.Info("kernel installed", "version", ki.Version, "release", ki.KernelRelease, "modules", len(ki.Modules), "pinned", ki.Pinned)
	return ki, nil
}

// chooseKernel decides which package, version and digest to install.
func chooseKernel(ctx context.Context, opts FetchOptions, log *slog.Logger) (kernelSource, error) {
	pin := KernelPin
	if opts.FromDeb != "" {
		sha, err := sha256File(opts.FromDeb)
		if err != nil {
			return kernelSource{}, fmt.Errorf("reading --from-deb file: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		if sha == pin.SHA256 {
			return kernelSource{pkg: pin.Package, version: pin.Version, sha: sha, deb: opts.FromDeb, pinned: true}, nil
		}
		if !opts.AllowUnpinned {
			return kernelSource{}, fmt.Errorf("%s: sha256 %s does not match the pinned %s %s (sha256 %s); pass the pinned package or add --allow-unpinned: %w",
				opts.FromDeb, sha, pin.Package, pin.Version, pin.SHA256, errdefs.ErrInvalidArgument)
		}
		ctl, err := debControl(opts.FromDeb)
		if err != nil {
			return kernelSource{}, fmt.Errorf("reading --from-deb file: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		ver := ctl.Version.String()
		warnUnpinned(log, ctl.Package, ver, sha)
		return kernelSource{pkg: ctl.Package, version: ver, sha: sha, deb: opts.FromDeb}, nil
	}
	if !opts.AllowUnpinned {
		return kernelSource{pkg: pin.Package, version: pin.Version, sha: pin.SHA256, pinned: true}, nil
	}
	cand, err := opts.Apt.Candidate(ctx, KernelMetaPackage)
	if err != nil {
		return kernelSource{}, aptMissing(err)
	}
	meta, err := opts.Apt.Show(ctx, KernelMetaPackage, cand)
	if err != nil {
		return kernelSource{}, aptMissing(err)
	}
	pkg, ver, ok := exactDep(meta.GetDepends(), "linux-image-")
	if !ok {
		return kernelSource{}, fmt.Errorf("%s %s: no exact linux-image dependency in %q", KernelMetaPackage, cand, meta.Values["Depends"])
	}
	fields, err := opts.Apt.Show(ctx, pkg, ver)
	if err != nil {
		return kernelSource{}, aptMissing(err)
	}
	sha := strings.ToLower(fields.SHA256)
	if len(sha) != 64 {
		return kernelSource{}, fmt.Errorf("apt-cache show %s=%s: no SHA256 field", pkg, ver)
	}
	pinned := pkg == pin.Package && ver == pin.Version && sha == pin.SHA256
	if !pinned {
		warnUnpinned(log, pkg, ver, sha)
	}
	return kernelSource{pkg: pkg, version: ver, sha: sha, pinned: pinned}, nil
}

func warnUnpinned(log *slog.Logger, pkg, ver, sha string) {
	log.Warn("USING AN UNPINNED KERNEL: it was not tested with isopod; runs may fail to boot",
		"package", pkg, "version", ver, "sha256", sha, "pinned_version", KernelPin.Version)
}

// aptMissing adds the --from-deb hint when apt is not installed.
func aptMissing(err error) error {
	if m := (*hosttool.MissingError)(nil); errors.As(err, &m) {
		return fmt.Errorf("%w; without apt, download %s_%s_amd64.deb elsewhere and pass --from-deb FILE", err, KernelPin.Package, KernelPin.Version)
	}
	return err
}

// explainDownload turns apt failures into advice.
func explainDownload(err error, src kernelSource) error {
	if errors.Is(err, ErrNotServed) && src.pinned {
		return fmt.Errorf("the pinned kernel %s %s is no longer served by the configured apt sources; "+
			"pass --allow-unpinned to take the newest cloud kernel apt offers, or --from-deb FILE with the pinned package: %w",
			src.pkg, src.version, err)
	}
	return aptMissing(err)
}

// verifyDigest refuses a file whose sha256 is not want.
func verifyDigest(path, want string) error {
	got, err := sha256File(path)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s: sha256 mismatch: got %s, want %s; refusing to use it: %w",
			filepath.Base(path), got, want, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// replaceDir renames the finished directory stage to dir, moving any old
// dir aside first and deleting it afterwards.
func replaceDir(stage, dir string) error {
	var old string
	if _, err := os.Lstat(dir); err == nil {
		old = stage + ".old"
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("replacing %s: %w", dir, err)
		}
	}
	if err := os.Rename(stage, dir); err != nil {
		if old != "" {
			os.Rename(old, dir)
		}
		return fmt.Errorf("publishing %s: %w", dir, err)
	}
	if old != "" {
		os.RemoveAll(old)
	}
	return syncDir(filepath.Dir(dir))
}

// copyTo writes r to a new file at path, creating parents.
func copyTo(path string, r io.Reader, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

func readKernelInfo(dir string) (KernelInfo, error) {
	var ki KernelInfo
	if err := readJSON(filepath.Join(dir, "kernel.json"), &ki); err != nil {
		return KernelInfo{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinuz")); err != nil {
		return KernelInfo{}, err
	}
	ki.Dir = dir
	return ki, nil
}

// BootKernel is the kernel a guest boots and the modules its initramfs
// carries.
type BootKernel struct {
	Path    string // the kernel image
	BuiltIn bool   // a --kernel/ISOPOD_KERNEL kernel: no modules are loaded
	// Info is the fetched kernel's record (zero for a built-in kernel).
	Info KernelInfo
	// Modules are host paths of the modules, in load order; Info.Modules
	// gives their paths under /lib/modules/<release>.
	Modules []string
}

// ResolveKernel picks the guest kernel: custom (from --kernel or
// $ISOPOD_KERNEL, read by the front ends) if set, else the fetched kernel
// (the pinned version when present, else the most recently fetched one).
func ResolveKernel(paths paths.Paths, custom string) (BootKernel, error) {
	from := "--kernel/" + knobs.Kernel
	if custom != "" {
		abs, err := filepath.Abs(custom)
		if err != nil {
			return BootKernel{}, fmt.Errorf("%s %q: %w", from, custom, errdefs.ErrInvalidArgument)
		}
		fi, err := os.Stat(abs)
		if err != nil || !fi.Mode().IsRegular() {
			return BootKernel{}, fmt.Errorf("%s %q: not a readable kernel file: %w", from, custom, errdefs.ErrNotFound)
		}
		return BootKernel{Path: abs, BuiltIn: true}, nil
	}
	ki, err := readKernelInfo(filepath.Join(paths.Kernels(), KernelPin.Version))
	if err != nil {
		entries, _ := os.ReadDir(paths.Kernels())
		var found []KernelInfo
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if k, err := readKernelInfo(filepath.Join(paths.Kernels(), e.Name())); err == nil {
				found = append(found, k)
			}
		}
		if len(found) == 0 {
			return BootKernel{}, fmt.Errorf("no guest kernel in %s: run `isopod image fetch-kernel` (or pass --kernel / set %s to a kernel with the virtio drivers built in): %w",
				paths.Kernels(), knobs.Kernel, errdefs.ErrFailedPrecondition)
		}
		sort.Slice(found, func(i, j int) bool { return found[i].FetchedUnix > found[j].FetchedUnix })
		ki = found[0]
	}
	bk := BootKernel{Path: filepath.Join(ki.Dir, "vmlinuz"), Info: ki}
	for _, m := range ki.Modules {
		bk.Modules = append(bk.Modules, filepath.Join(ki.Dir, "modules", m))
	}
	return bk, nil
}
