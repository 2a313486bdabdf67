package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
	"isopod/internal/paths"
)

// BuildBaseDebian builds base-debian with debootstrap (minbase plus
// DebianPackages) from the host's configured Debian mirror. It takes
// minutes; progress goes to the logger.
func BuildBaseDebian(ctx context.Context, paths paths.Paths, opts BuildOptions) (BaseInfo, error) {
	log := logger(opts.Logger)
	if !opts.Force {
		if info, ok := currentBase(paths, FlavorBaseDebian, nil); ok {
			log.Info("base image is current (rebuild with force; stages made on it will then refer to the old build)",
				"flavor", FlavorBaseDebian, "path", info.Path)
			return info, nil
		}
	}
	if os.Geteuid() != 0 {
		return BaseInfo{}, fmt.Errorf("building %s runs debootstrap, which needs root: run it as root: %w", FlavorBaseDebian, errdefs.ErrFailedPrecondition)
	}
	bin, err := hosttool.Find("debootstrap")
	if err != nil {
		return BaseInfo{}, fmt.Errorf("building %s: %w", FlavorBaseDebian, err)
	}
	mirror := opts.Mirror
	if mirror == "" {
		if mirror, err = hostMirror("/etc/apt", DebianSuite); err != nil {
			return BaseInfo{}, err
		}
	}
	if u, err := url.Parse(mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") {
		return BaseInfo{}, fmt.Errorf("mirror %q is not an http, https or file URL: %w", mirror, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(paths.Images(), 0o755); err != nil {
		return BaseInfo{}, fmt.Errorf("creating images directory: %w", err)
	}
	work, err := os.MkdirTemp(paths.Images(), ".tmp-"+FlavorBaseDebian+"-")
	if err != nil {
		return BaseInfo{}, err
	}
	root := filepath.Join(work, "root")
	defer func() {
		unmountUnder(root, log)
		os.RemoveAll(work)
	}()
	if err := os.Chmod(work, 0o755); err != nil {
		return BaseInfo{}, err
	}

	start := time.Now()
	log.Info("bootstrapping base-debian (takes minutes)", "suite", DebianSuite, "mirror", mirror)
	args := []string{"--variant=minbase", "--components=main", DebianSuite, root, mirror}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if err := runLogged(log, "debootstrap", cmd); err != nil {
		if b, rerr := os.ReadFile(filepath.Join(root, "debootstrap", "debootstrap.log")); rerr == nil {
			err = fmt.Errorf("%w\ndebootstrap.log ends:\n%s", err, lastLines(string(b), 30))
		}
		return BaseInfo{}, err
	}
	unmountUnder(root, log)
	log.Info("debootstrap finished; installing packages", "elapsed", time.Since(start).Round(time.Second), "packages", strings.Join(DebianPackages, ","))
	if err := installInChroot(ctx, log, root, sourcesListFor("/etc/apt", mirror, DebianSuite)); err != nil {
		return BaseInfo{}, err
	}
	log.Info("packages installed", "elapsed", time.Since(start).Round(time.Second))

	inputs, err := installedPackages(ctx, root)
	if err != nil {
		return BaseInfo{}, err
	}
	if err := tidyDebianRoot(root); err != nil {
		return BaseInfo{}, fmt.Errorf("tidying the root: %w", err)
	}
	info := BaseInfo{Flavor: FlavorBaseDebian, Inputs: inputs, Suite: DebianSuite, Mirror: mirror}
	log.Info("packing base-debian", "packages", len(inputs))
	if err := packAndPublish(ctx, paths, root, &info); err != nil {
		return BaseInfo{}, err
	}
	log.Info("base image built", "flavor", info.Flavor, "size", info.Size, "sha256", info.ContentSHA256, "elapsed", time.Since(start).Round(time.Second))
	return info, nil
}

// installInChroot upgrades root from the host's sources for the suite
// (updates and security included) and installs DebianPackages without
// recommends, with /proc mounted for the maintainer scripts.
func installInChroot(ctx context.Context, log *slog.Logger, root, sources string) error {
	chroot, err := hosttool.Find("chroot")
	if err != nil {
		return err
	}
	if err := writeFixed(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return err
	}
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := writeFixed(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	defer os.Remove(policy)
	proc := filepath.Join(root, "proc")
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc in the build root: %w", err)
	}
	defer unmountUnder(root, log)
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", "HOME=/root"}
	steps := [][]string{
		{"apt-get", "-q", "update"},
		{"apt-get", "-q", "-y", "dist-upgrade"},
		append([]string{"apt-get", "-q", "-y", "install", "--no-install-recommends"}, DebianPackages...),
	}
	for _, st := range steps {
		cmd := exec.CommandContext(ctx, chroot, append([]string{root}, st...)...)
		cmd.Env = env
		if err := runLogged(log, strings.Join(st[:2], " "), cmd); err != nil {
			return err
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// runLogged runs a long command, logging its output at debug level and a
// progress line at info level at most every 15 seconds.
func runLogged(log *slog.Logger, what string, cmd *exec.Cmd) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var tail []string
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		last := time.Now()
		for sc.Scan() {
			l := sc.Text()
			log.Debug(what, "line", l)
			mu.Lock()
			tail = append(tail, l)
			if len(tail) > 20 {
				tail = tail[1:]
			}
			mu.Unlock()
			if time.Since(last) > 15*time.Second {
				log.Info(what+" progress", "last", l)
				last = time.Now()
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
	}
	pw.Close()
	<-done
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%s: %w; last output:\n%s", what, err, strings.Join(tail, "\n"))
	}
	return nil
}

// installedPackages lists every package installed in root with its version
// and, when debootstrap left the .deb behind, its sha256.
func installedPackages(ctx context.Context, root string) ([]Pin, error) {
	dpkg, err := hosttool.Find("dpkg-query")
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, dpkg, "--admindir="+filepath.Join(root, "var/lib/dpkg"),
		"-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n").Output()
	if err != nil {
		return nil, fmt.Errorf("listing installed packages: %w", err)
	}
	var pins []Pin
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 4 || !strings.HasPrefix(f[0], "ii") {
			continue
		}
		p := Pin{Package: f[1], Version: f[2]}
		ver := f[2]
		if i := strings.IndexByte(ver, ':'); i >= 0 {
			ver = ver[i+1:]
		}
		for _, name := range []string{f[1] + "_" + ver + "_" + f[3] + ".deb", f[1] + "_" + strings.ReplaceAll(f[2], ":", "%3a") + "_" + f[3] + ".deb"} {
			if sum, err := sha256File(filepath.Join(root, "var/cache/apt/archives", name)); err == nil {
				p.SHA256 = sum
				break
			}
		}
		pins = append(pins, p)
	}
	if len(pins) == 0 {
		return nil, fmt.Errorf("dpkg-query found no installed packages in %s", root)
	}
	sort.Slice(pins, func(i, j int) bool { return pins[i].Package < pins[j].Package })
	return pins, nil
}

// tidyDebianRoot removes caches and host leftovers, lets pip install into
// the system Python, and lays down the skeleton every base has.
func tidyDebianRoot(root string) error {
	globs := []string{
		"usr/lib/python3*/EXTERNALLY-MANAGED",
		"var/cache/apt/archives/*.deb", "var/cache/apt/archives/partial/*", "var/cache/apt/*.bin",
		"var/lib/apt/lists/*", "var/log/*.log", "var/log/apt/*", "var/cache/debconf/*-old",
		"var/lib/dpkg/*-old", "root/.cache", "tmp/*", "var/tmp/*", "run/*", "dev/*", "proc/*", "sys/*",
	}
	for _, g := range globs {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return err
		}
		for _, p := range m {
			if filepath.Base(p) == "lock" || filepath.Base(p) == "partial" {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	if m, _ := filepath.Glob(filepath.Join(root, "usr/lib/python3*/EXTERNALLY-MANAGED")); len(m) != 0 {
		return fmt.Errorf("EXTERNALLY-MANAGED marker still present: %v", m)
	}
	return makeRootSkeleton(root)
}

// unmountUnder detaches every mount at or below root (debootstrap mounts
// proc and sys in the target; an interrupted run can leave them).
func unmountUnder(root string, log *slog.Logger) {
	for _, mp := range mountsUnder(root) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			log.Warn("could not unmount a build mount", "path", mp, "err", err)
		}
	}
}

// mountsUnder lists the mount points at or below root, deepest first.
func mountsUnder(root string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var mps []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(l))
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == root || strings.HasPrefix(mp, root+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
