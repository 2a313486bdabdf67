package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Package metadata.
const (
	pkgName    = "isopod"
	maintainer = "The isopod authors <maintainers@isopod.invalid>" // .invalid: no list exists yet
	summary    = "run commands in throwaway microVMs; keep state as stages"
	licence    = "MIT"
)

// description is the long description (the packages indent it themselves).
const description = summary + `
isopod runs each command in a fresh QEMU microVM through a small guest
agent, prints one JSON report and destroys the VM. State survives only as
stages: immutable, content-addressed filesystem layers to fork from.
This package holds the isopod command, the isopod-mcp stdio MCP server for
coding agents, the static guest agent, and a Claude Code plugin (launcher,
marketplace and skill) under /usr/share/isopod. Guest images are built
after installation: isopod image fetch-kernel, then isopod image build-all.`

// Dependencies. QEMU 7.2 is the oldest isopod is tested with (Debian 12's).
var (
	debDepends = []string{
		"qemu-system-x86 (>= 1:7.2)", // qemu-system-x86_64
		"e2fsprogs",                  // mkfs.ext4, debugfs: scratch disks and stages
		"squashfs-tools",             // mksquashfs: base images
		"uidmap",                     // newuidmap, newgidmap: the VMM jail's subordinate ids
		"util-linux (>= 2.38)",       // unshare --map-users: the VMM jail
		"git",                        // workspaces
		"passwd",                     // useradd, userdel: the jail's system user
	}
	debRecommends = []string{"debootstrap"} // base-debian
	rpmDepends    = []string{
		"qemu-system-x86-core >= 7.2",
		"e2fsprogs",
		"squashfs-tools",
		"shadow-utils", // newuidmap, newgidmap, useradd, userdel
		"util-linux >= 2.38",
		"git",
	}
	rpmRecommends = []string{"debootstrap"}
)

// versionRE is what a release version may look like: VERSION, then at most
// a build suffix (+g<commit>, .dirty), which Debian and RPM both accept.
// binaries are the programs a release ships, as built into Release.Bin.
var binaries = []string{"isopod", "isopod-mcp", "isopod-agent", "isopod-jail"}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(\+[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?$`)

// Release is one packaging of a build.
type Release struct {
	Src     string // source tree of the commit
	Bin     string // isopod, isopod-mcp, isopod-agent, isopod-jail
	Version string // what the binaries report
	Commit  string
	Epoch   int64 // SOURCE_DATE_EPOCH
	Out     string

	// Test seams; nil in production.
	notices     func(ctx context.Context, bins []string) ([]byte, error)
	checkBinary func(ctx context.Context, name, path string) error
}

// Artifact names.
func (r *Release) debName() string { return fmt.Sprintf("%s_%s_amd64.deb", pkgName, r.Version) }
func (r *Release) rpmName() string { return fmt.Sprintf("%s-%s.x86_64.rpm", pkgName, r.Version) }
func (r *Release) tarName() string {
	return fmt.Sprintf("%s-%s-linux-amd64.tar.gz", pkgName, r.Version)
}

// tarTop is the tarball's one top-level directory.
func (r *Release) tarTop() string { return fmt.Sprintf("%s-%s-linux-amd64", pkgName, r.Version) }

func (r *Release) mtime() time.Time { return time.Unix(r.Epoch, 0).UTC() }

// validate checks the inputs before anything is written.
func (r *Release) validate() error {
	switch {
	case r.Src == "" || r.Bin == "" || r.Out == "":
		return errors.New("-src, -bin and -out are required")
	case r.Commit == "":
		return errors.New("-commit is required")
	case !versionRE.MatchString(r.Version):
		return fmt.Errorf("-version %q: want MAJOR.MINOR.PATCH with at most a +build suffix", r.Version)
	case r.Epoch <= 0:
		return errors.New("-epoch is required")
	}
	b, err := os.ReadFile(filepath.Join(r.Src, "internal", "version", "VERSION"))
	if err != nil {
		return fmt.Errorf("reading the source tree's version: %w", err)
	}
	release := strings.TrimSpace(string(b))
	if v, _, _ := strings.Cut(r.Version, "+"); v != release {
		return fmt.Errorf("-version %s is not a build of internal/version/VERSION %s", r.Version, release)
	}
	return nil
}

// Build writes the three artifacts and SHA256SUMS into Out and returns
// their paths.
func (r *Release) Build(ctx context.Context) ([]string, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	for _, name := range binaries {
		check := r.checkBinary
		if check == nil {
			check = r.verifyBinary
		}
		if err := check(ctx, name, filepath.Join(r.Bin, name)); err != nil {
			return nil, err
		}
	}
	stage, err := os.MkdirTemp("", "isopod-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	gen, err := r.generate(ctx, filepath.Join(stage, "gen"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.Out, 0o755); err != nil {
		return nil, err
	}
	src := func(f file) string {
		switch f.from {
		case fromBin:
			return filepath.Join(r.Bin, f.src)
		case fromSrc:
			return filepath.Join(r.Src, filepath.FromSlash(f.src))
		}
		return filepath.Join(gen, f.src)
	}
	for _, f := range releaseFiles() {
		if _, err := os.Stat(src(f)); err != nil {
			return nil, fmt.Errorf("%s: %w", f.dst, err)
		}
	}
	arts := []string{
		filepath.Join(r.Out, r.debName()),
		filepath.Join(r.Out, r.rpmName()),
		filepath.Join(r.Out, r.tarName()),
	}
	scripts := filepath.Join(stage, "scripts")
	if err := writeScripts(scripts); err != nil {
		return nil, err
	}
	if err := r.writePackage(formatDeb, arts[0], src, scripts); err != nil {
		return nil, err
	}
	if err := r.writePackage(formatRPM, arts[1], src, scripts); err != nil {
		return nil, err
	}
	if err := r.writeTarball(arts[2], src); err != nil {
		return nil, err
	}
	sums := filepath.Join(r.Out, "SHA256SUMS")
	if err := writeSums(sums, arts); err != nil {
		return nil, err
	}
	return append(arts, sums), nil
}

// verifyBinary checks that a binary is a static x86-64 executable and that
// the two front ends report the release's version.
func (r *Release) verifyBinary(ctx context.Context, name, path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is built for %s; the release is linux/amd64", path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	if name == "isopod-agent" || name == "isopod-jail" {
		return nil // no --version: the guest's init and the jail helper
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", path, err)
	}
	if want := name + " version " + r.Version; strings.TrimSpace(string(out)) != want {
		return fmt.Errorf("%s --version says %q; want %q (stamp it with -ldflags -X isopod/internal/version.suffix=...)",
			path, bytes.TrimSpace(out), want)
	}
	return nil
}
