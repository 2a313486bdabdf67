package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"isopod/internal/errdefs"
)

var vmlinuzRE = regexp.MustCompile(`^boot/vmlinuz-(.+)$`)
var moduleRE = regexp.MustCompile(`^(?:usr/)?lib/modules/([^/]+)/(.+)$`)

// installKernel extracts the kernel and the closure of mods from deb and
// publishes them atomically as dir. It fills ki.KernelRelease and ki.Modules.
func installKernel(deb, dir string, mods []string, ki *KernelInfo, log *slog.Logger) error {
	parent := filepath.Dir(dir)
	stage, err := os.MkdirTemp(parent, ".tmp-"+filepath.Base(dir)+"-")
	if err != nil {
		return fmt.Errorf("creating staging directory: %w", err)
	}
	defer os.RemoveAll(stage)
	os.Chmod(stage, 0o755)
	all := filepath.Join(stage, "all")

	start := time.Now()
	pkg, err := extractKernelDeb(deb, stage, all, ki)
	if err != nil {
		return fmt.Errorf("extracting kernel package: %w", err)
	}
	if ki.KernelRelease == "" {
		return fmt.Errorf("%s: no boot/vmlinuz-* in the package: is it a linux-image package? %w", deb, errdefs.ErrInvalidArgument)
	}
	log.Debug("kernel package extracted", "modules", len(pkg.kos), "elapsed", time.Since(start).Round(time.Millisecond))

	index, err := pkg.moduleIndex(all)
	if err != nil {
		return err
	}
	builtin, _ := parseBuiltin(bytes.NewReader(pkg.builtinList))
	order, err := closure(mods, index, builtin)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", ki.KernelRelease, err)
	}
	if err := stageModules(order, stage, all, ki); err != nil {
		return err
	}
	tryVMLinux(filepath.Join(stage, "vmlinuz"), ki.SHA256, stage, log)
	if err := writeJSONAtomic(filepath.Join(stage, "kernel.json"), ki); err != nil {
		return err
	}
	if err := syncTree(stage); err != nil {
		return err
	}
	return replaceDir(stage, dir)
}

// kernelDeb is what extractKernelDeb found in a kernel package besides the
// kernel image.
type kernelDeb struct {
	builtinList []byte   // modules.builtin; nil when absent
	depFile     []byte   // modules.dep; nil when absent
	kos         []string // the extracted modules, relative to the module tree
}

// extractKernelDeb extracts deb's kernel image to stage/vmlinuz, setting
// ki.KernelRelease, and every module (decompressed) under all.
func extractKernelDeb(deb, stage, all string, ki *KernelInfo) (*kernelDeb, error) {
	pkg := &kernelDeb{}
	err := walkDebData(deb, func(name string, h *tar.Header, r io.Reader) error {
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		if m := vmlinuzRE.FindStringSubmatch(name); m != nil {
			if ki.KernelRelease != "" && ki.KernelRelease != m[1] {
				return fmt.Errorf("package holds two kernels (%s, %s)", ki.KernelRelease, m[1])
			}
			ki.KernelRelease = m[1]
			return copyTo(filepath.Join(stage, "vmlinuz"), r, 0o644)
		}
		m := moduleRE.FindStringSubmatch(name)
		if m == nil {
			return nil
		}
		return pkg.extractModuleFile(name, m[2], r, all)
	})
	if err != nil {
		return nil, err
	}
	return pkg, nil
}

// extractModuleFile handles name, the file rel of the module tree: it keeps
// modules.builtin and modules.dep, and extracts a module to all/rel,
// decompressing a .ko.xz.
func (pkg *kernelDeb) extractModuleFile(name, rel string, r io.Reader, all string) error {
	var err error
	switch {
	case rel == "modules.builtin":
		pkg.builtinList, err = io.ReadAll(r)
		return err
	case rel == "modules.dep":
		pkg.depFile, err = io.ReadAll(r)
		return err
	case strings.HasSuffix(rel, ".ko"):
		pkg.kos = append(pkg.kos, rel)
		return copyTo(filepath.Join(all, rel), r, 0o644)
	case strings.HasSuffix(rel, ".ko.xz"):
		rel = strings.TrimSuffix(rel, ".xz")
		xr, err := decompressXZ(r)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer xr.Close()
		pkg.kos = append(pkg.kos, rel)
		return copyTo(filepath.Join(all, rel), xr, 0o644)
	}
	return nil
}

// moduleIndex indexes the package's modules by name: from modules.dep when
// the package has one (with paths of the decompressed files), else by
// reading each extracted module under all.
func (pkg *kernelDeb) moduleIndex(all string) (map[string]modInfo, error) {
	if pkg.depFile != nil {
		index, err := parseModulesDep(bytes.NewReader(pkg.depFile))
		if err != nil {
			return nil, fmt.Errorf("reading modules.dep: %w", err)
		}
		for n, mi := range index {
			mi.Path = strings.TrimSuffix(mi.Path, ".xz")
			index[n] = mi
		}
		return index, nil
	}
	index := map[string]modInfo{}
	for _, rel := range pkg.kos {
		mi, err := readModInfoFile(filepath.Join(all, rel), rel)
		if err != nil {
			return nil, err
		}
		index[mi.Name] = mi
	}
	return index, nil
}

// stageModules moves the modules of order from all to stage/modules,
// records them in ki.Modules and stage/modules.order, and removes the
// rest of all.
func stageModules(order []modInfo, stage, all string, ki *KernelInfo) error {
	ki.Modules = ki.Modules[:0]
	var orderFile strings.Builder
	for _, mi := range order {
		dst := filepath.Join(stage, "modules", mi.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(all, mi.Path), dst); err != nil {
			return fmt.Errorf("module %s listed but not extracted: %w", mi.Path, err)
		}
		ki.Modules = append(ki.Modules, mi.Path)
		orderFile.WriteString(mi.Path + "\n")
	}
	if err := os.RemoveAll(all); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(stage, "modules.order"), []byte(orderFile.String()), 0o644)
}
