package main

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
	"github.com/goreleaser/nfpm/v2/rpm"
)

// maintainer holds the packages' install and removal scripts.
//
//go:embed maintainer
var maintainerScripts embed.FS

// writeScripts copies the maintainer scripts into dir (nfpm reads them by
// path).
func writeScripts(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ents, err := fs.ReadDir(maintainerScripts, "maintainer")
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := maintainerScripts.ReadFile("maintainer/" + e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// info is the nfpm description of the f package.
func (r *Release) info(f format, src func(file) string, scripts string) *nfpm.Info {
	mtime := r.mtime()
	info := &nfpm.Info{
		Name:            pkgName,
		Arch:            "amd64",
		Platform:        "linux",
		Version:         r.Version,
		VersionSchema:   "none", // the version is used as it is, in both formats
		Section:         "utils",
		Priority:        "optional",
		Maintainer:      maintainer,
		Description:     description,
		Vendor:          "the isopod authors",
		License:         licence,
		DisableGlobbing: true,
		MTime:           mtime,
	}
	for _, fl := range filesFor(f) {
		ct := files.TypeFile
		if f == formatRPM && fl.dst == path.Join(rpmLicence, "LICENSE") {
			ct = files.TypeRPMLicense
		}
		info.Contents = append(info.Contents, &files.Content{
			Source:      src(fl),
			Destination: "/usr/" + fl.dst,
			Type:        ct,
			FileInfo:    &files.ContentFileInfo{Owner: "root", Group: "root", Mode: fl.mode, MTime: mtime},
		})
	}
	for _, d := range ownedDirs(f) {
		info.Contents = append(info.Contents, &files.Content{
			Destination: "/usr/" + d,
			Type:        files.TypeDir,
			FileInfo:    &files.ContentFileInfo{Owner: "root", Group: "root", Mode: 0o755, MTime: mtime},
		})
	}
	script := func(name string) string { return filepath.Join(scripts, name) }
	switch f {
	case formatDeb:
		info.Depends, info.Recommends = debDepends, debRecommends
		info.Scripts = nfpm.Scripts{PostInstall: script("deb-postinst"), PostRemove: script("deb-postrm")}
	case formatRPM:
		info.Release = "1"
		info.Depends, info.Recommends = rpmDepends, rpmRecommends
		info.Scripts = nfpm.Scripts{PostInstall: script("rpm-post"), PostRemove: script("rpm-postun")}
		info.RPM = nfpm.RPM{
			Summary:   summary,
			Group:     "Development/Tools",
			BuildHost: "isopod-release", // not this machine's name: the same bytes anywhere
			Packager:  maintainer,
		}
	}
	return info
}

// writePackage makes the deb or rpm at dst.
func (r *Release) writePackage(f format, dst string, src func(file) string, scripts string) (err error) {
	var p nfpm.Packager
	switch f {
	case formatDeb:
		p = deb.Default
	case formatRPM:
		p = rpm.DefaultRPM
	default:
		return fmt.Errorf("no packager for %s", f)
	}
	info := nfpm.WithDefaults(r.info(f, src, scripts))
	if err := nfpm.Validate(info); err != nil {
		return fmt.Errorf("%s: %w", f, err)
	}
	return writeAtomic(dst, func(w *os.File) error {
		if err := p.Package(info, w); err != nil {
			return fmt.Errorf("making the %s: %w", f, err)
		}
		return nil
	})
}

// writeAtomic writes dst through a temporary file renamed into place, so
// a failed build leaves no half-written artifact.
func writeAtomic(dst string, write func(*os.File) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
