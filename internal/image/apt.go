package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"pault.ag/go/debian/control"
	"pault.ag/go/debian/dependency"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
)

// ErrNotServed is returned (wrapped, with errdefs.ErrFailedPrecondition)
// when apt does not offer the requested version of a package.
var ErrNotServed = errors.New("package version not served by apt")

// Apt runs apt-get and apt-cache. The zero value finds both on PATH.
type Apt struct {
	GetBin   string // default: apt-get, found by hosttool.Find
	CacheBin string // default: apt-cache, found by hosttool.Find
}

func (a *Apt) bin(explicit, name string) (string, error) {
	if a != nil && explicit != "" {
		return explicit, nil
	}
	return hosttool.Find(name)
}

func (a *Apt) getBin() (string, error) {
	var e string
	if a != nil {
		e = a.GetBin
	}
	return a.bin(e, "apt-get")
}

func (a *Apt) cacheBin() (string, error) {
	var e string
	if a != nil {
		e = a.CacheBin
	}
	return a.bin(e, "apt-cache")
}

// rootOpts keeps apt-get from complaining that its sandbox user cannot write
// the download directory when isopod runs as root.
func rootOpts() []string {
	if os.Geteuid() == 0 {
		return []string{"-o", "APT::Sandbox::User=root"}
	}
	return nil
}

// Download fetches pkg at version into dir and returns the .deb's path.
// The caller verifies its digest.
func (a *Apt) Download(ctx context.Context, dir, pkg, version string) (string, error) {
	bin, err := a.getBin()
	if err != nil {
		return "", err
	}
	args := append([]string{"download", "-q"}, rootOpts()...)
	args = append(args, pkg+"="+version)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if notServed(msg) {
			return "", fmt.Errorf("apt-get download %s=%s: %w: %s: %w", pkg, version, ErrNotServed, msg, errdefs.ErrFailedPrecondition)
		}
		return "", fmt.Errorf("apt-get download %s=%s: %w: %s", pkg, version, err, msg)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s=%s: expected one .deb in %s, found %d", pkg, version, dir, len(debs))
	}
	return debs[0], nil
}

// notServed recognises apt's messages for a version or package it does not
// offer.
func notServed(msg string) bool {
	for _, s := range []string{"was not found", "Can't select", "Unable to locate package", "has no installation candidate"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Show returns the first stanza of `apt-cache show pkg[=version]`, a
// package index entry.
func (a *Apt) Show(ctx context.Context, pkg, version string) (control.BinaryIndex, error) {
	bin, err := a.cacheBin()
	if err != nil {
		return control.BinaryIndex{}, err
	}
	spec := pkg
	if version != "" {
		spec += "=" + version
	}
	out, err := exec.CommandContext(ctx, bin, "show", spec).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if notServed(msg) || strings.Contains(msg, "No packages found") {
			return control.BinaryIndex{}, fmt.Errorf("apt-cache show %s: %w: %s: %w", spec, ErrNotServed, msg, errdefs.ErrFailedPrecondition)
		}
		return control.BinaryIndex{}, fmt.Errorf("apt-cache show %s: %w: %s", spec, err, msg)
	}
	return parseIndexEntry(spec, out)
}

// parseIndexEntry decodes the first stanza of apt-cache show's output.
func parseIndexEntry(spec string, out []byte) (control.BinaryIndex, error) {
	var entry control.BinaryIndex
	err := control.Unmarshal(&entry, bytes.NewReader(out))
	if errors.Is(err, io.EOF) || (err == nil && entry.Package == "") {
		return control.BinaryIndex{}, fmt.Errorf("apt-cache show %s: no package stanza: %w", spec, ErrNotServed)
	}
	if err != nil {
		return control.BinaryIndex{}, fmt.Errorf("apt-cache show %s: reading the package stanza: %w", spec, err)
	}
	return entry, nil
}

// Candidate returns the version apt would install for pkg.
func (a *Apt) Candidate(ctx context.Context, pkg string) (string, error) {
	bin, err := a.cacheBin()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, bin, "policy", pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache policy %s: %w: %s", pkg, err, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate:"); ok {
			v = strings.TrimSpace(v)
			if v == "" || v == "(none)" {
				break
			}
			return v, nil
		}
	}
	return "", fmt.Errorf("apt-cache policy %s: no candidate version (is the package list updated? run apt-get update): %w", pkg, ErrNotServed)
}

// exactDep finds, in a dependency field, the first relation whose first
// alternative's name starts with prefix and that is pinned with
// "(= version)".
func exactDep(dep dependency.Dependency, prefix string) (name, version string, ok bool) {
	for _, rel := range dep.Relations {
		if len(rel.Possibilities) == 0 {
			continue
		}
		p := rel.Possibilities[0]
		if !strings.HasPrefix(p.Name, prefix) || p.Version == nil || p.Version.Operator != "=" {
			continue
		}
		return p.Name, p.Version.Number, true
	}
	return "", "", false
}
