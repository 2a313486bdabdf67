package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

// BuildBaseMin builds base-min: the pinned static busybox (BusyboxPin,
// fetched from a Debian mirror's pool) with a link for every applet, and the
// skeleton every base has.
func BuildBaseMin(ctx context.Context, paths paths.Paths, opts BuildOptions) (BaseInfo, error) {
	log := logger(opts.Logger)
	pin := BusyboxPin
	if !opts.Force {
		if info, ok := currentBase(paths, FlavorBaseMin, []Pin{pin}); ok {
			log.Info("base image is current", "flavor", FlavorBaseMin, "path", info.Path)
			return info, nil
		}
	}
	if err := os.MkdirAll(paths.Images(), 0o755); err != nil {
		return BaseInfo{}, fmt.Errorf("creating images directory: %w", err)
	}
	work, err := os.MkdirTemp(paths.Images(), ".tmp-"+FlavorBaseMin+"-")
	if err != nil {
		return BaseInfo{}, err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return BaseInfo{}, err
	}
	dl := filepath.Join(work, "download")
	if err := os.Mkdir(dl, 0o755); err != nil {
		return BaseInfo{}, err
	}
	log.Info("downloading busybox", "package", pin.Package, "version", pin.Version)
	deb, err := fetchFromPool(ctx, opts.HTTPClient, log, dl, poolMirrors(opts.Mirror, "/etc/apt"), pin)
	if err != nil {
		return BaseInfo{}, fmt.Errorf("fetching %s: %w", pin.Package, err)
	}
	root := filepath.Join(work, "root")
	if err := makeRootSkeleton(root); err != nil {
		return BaseInfo{}, fmt.Errorf("creating root skeleton: %w", err)
	}
	bb := filepath.Join(root, "bin", "busybox")
	if err := extractBusybox(deb, bb); err != nil {
		return BaseInfo{}, err
	}
	applets, err := busyboxApplets(ctx, bb)
	if err != nil {
		return BaseInfo{}, err
	}
	for _, a := range applets {
		p := filepath.Join(root, a)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return BaseInfo{}, err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil {
			return BaseInfo{}, fmt.Errorf("linking applet %s: %w", a, err)
		}
	}
	for _, f := range []struct{ path, body string }{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"},
		{"etc/group", "root:x:0:\n"},
		{"etc/shadow", "root:*::0:99999:7:::\n"},
	} {
		if err := writeFixed(filepath.Join(root, f.path), []byte(f.body), 0o644); err != nil {
			return BaseInfo{}, err
		}
	}
	if err := os.Chmod(filepath.Join(root, "etc/shadow"), 0o640); err != nil {
		return BaseInfo{}, err
	}
	info := BaseInfo{Flavor: FlavorBaseMin, Inputs: []Pin{pin}}
	if err := packAndPublish(ctx, paths, root, &info); err != nil {
		return BaseInfo{}, err
	}
	log.Info("base image built", "flavor", info.Flavor, "size", info.Size, "sha256", info.ContentSHA256, "applets", len(applets))
	return info, nil
}

// extractBusybox writes the busybox binary of the busybox-static package.
func extractBusybox(deb, dst string) error {
	found := false
	err := walkDebData(deb, func(name string, h *tar.Header, r io.Reader) error {
		if h.Typeflag != tar.TypeReg || (name != "bin/busybox" && name != "usr/bin/busybox") {
			return nil
		}
		found = true
		return copyTo(dst, r, 0o755)
	})
	if err != nil {
		return fmt.Errorf("extracting busybox: %w", err)
	}
	if !found {
		return fmt.Errorf("%s holds no bin/busybox: %w", deb, errdefs.ErrInvalidArgument)
	}
	return os.Chmod(dst, 0o755)
}

// busyboxApplets asks the (static) busybox for its applets' install paths,
// e.g. "usr/bin/awk", sorted, without busybox itself.
func busyboxApplets(ctx context.Context, bb string) ([]string, error) {
	cmd := exec.CommandContext(ctx, bb, "--list-full")
	cmd.Env = []string{}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets (%s --list-full): %w: %s", bb, err, strings.TrimSpace(stderr.String()))
	}
	var applets []string
	seen := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		c := path.Clean("/" + l)[1:]
		if l == "" || c != l || c == "bin/busybox" || seen[c] {
			continue
		}
		seen[c] = true
		applets = append(applets, c)
	}
	if len(applets) < 10 {
		return nil, fmt.Errorf("busybox --list-full listed only %d applets", len(applets))
	}
	sort.Strings(applets)
	return applets, nil
}
