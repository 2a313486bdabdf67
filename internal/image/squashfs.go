package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/hosttool"
	"isopod/internal/paths"
)

// BaseInfo is a base image sidecar (images/base-<flavor>.json).
type BaseInfo struct {
	Flavor string `json:"flavor"`
	// Recipe is the build recipe's revision; see baseRecipes.
	Recipe          int    `json:"recipe"`
	ContentSHA256   string `json:"content_sha256"` // sha256 of the .sqfs
	ProtocolVersion int    `json:"protocol_version"`
	// Inputs are the packages the image is made of (every installed package
	// for base-debian); SHA256 is the .deb digest where known.
	Inputs    []Pin  `json:"inputs"`
	Suite     string `json:"suite,omitempty"`
	Mirror    string `json:"mirror,omitempty"`
	BuiltUnix int64  `json:"built_unix"`
	Size      int64  `json:"size"`

	// Kind is how a stored base was made: KindBuilt (by `isopod image
	// build`, on this host or the one it was pulled from) or KindImported.
	// Empty in the sidecars of the bases built here.
	Kind string `json:"kind,omitempty"`
	// Name is what runs call a stored base (--base); empty for a pulled
	// build kept by content id only. See bases.go.
	Name string `json:"name,omitempty"`
	// SquashfsSHA256 is the sha256 of the squashfs where the content id
	// is not (an imported base's id derives from its image).
	SquashfsSHA256 string `json:"squashfs_sha256,omitempty"`
	// Image describes an imported base's container image.
	Image *ImageSource `json:"image,omitempty"`
	// PulledFrom is the repository a pulled base came from.
	PulledFrom string `json:"pulled_from,omitempty"`

	Path   string `json:"-"`
	Cached bool   `json:"-"`
}

// baseRecipes are the bases' build recipe revisions. A flavor's is bumped
// whenever the way it is made changes (layout, inputs, mksquashfs options):
// a base made by another revision is rebuilt by the next build and refused
// as stale until then. base-min 2: busybox 1.37 from trixie.
var baseRecipes = map[string]int{FlavorBaseMin: 2, FlavorBaseDebian: 1}

// BasePath is where a base flavor's squashfs lives.
func BasePath(paths paths.Paths, flavor string) string {
	return filepath.Join(paths.Images(), flavor+".sqfs")
}

// squashfsArgs are the options that make mksquashfs reproducible: fixed
// times, root ownership, fixed compression, no xattrs from the build host.
// mksquashfs sorts directory entries itself.
var squashfsArgs = []string{
	"-noappend", "-all-root", "-mkfs-time", "0", "-all-time", "0",
	"-comp", "zstd", "-Xcompression-level", "6", "-b", "131072",
	"-no-xattrs", "-no-exports", "-reproducible", "-quiet", "-no-progress",
}

// mksquashfs packs dir into out reproducibly.
func mksquashfs(ctx context.Context, dir, out string) error {
	return MkSquashfs(ctx, dir, out, squashfsArgs...)
}

// MkSquashfs packs dir into the image out with mksquashfs and args. A
// SOURCE_DATE_EPOCH in the environment is not passed on: it would set
// every file's time to it.
func MkSquashfs(ctx context.Context, dir, out string, args ...string) error {
	bin, err := hosttool.Find("mksquashfs")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{dir, out}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.WaitDelay = 5 * time.Second
	var o bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &o
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mksquashfs: %w: %s", err, strings.TrimSpace(o.String()))
	}
	return nil
}

// makeRootSkeleton creates the directories every base needs (the agent's
// mountpoints and a usable root) with fixed modes, and the /etc files isopod
// owns.
func makeRootSkeleton(root string) error {
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"root", 0o700}, {"tmp", 0o1777}, {"var", 0o755}, {"var/tmp", 0o1777},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755}, {"mnt", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			continue // a merged-/usr link such as bin -> usr/bin
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, chmodBits(d.mode)); err != nil {
			return err
		}
	}
	files := []struct {
		path, body string
	}{
		{"etc/hostname", "isopod\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"etc/resolv.conf", "# The isopod agent writes the resolver here when the network is on.\n"},
	}
	for _, f := range files {
		if err := writeFixed(filepath.Join(root, f.path), []byte(f.body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// chmodBits converts Unix octal mode bits (0o1777) to os.FileMode.
func chmodBits(m os.FileMode) os.FileMode {
	out := m.Perm()
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	return out
}

// writeFixed replaces path (even a symlink) with a file of exactly perm.
func writeFixed(path string, data []byte, perm os.FileMode) error {
	os.Remove(path)
	if err := os.WriteFile(path, data, perm); err != nil {
		return err
	}
	return os.Chmod(path, perm)
}

// packAndPublish packs root into the flavor's squashfs and publishes it with
// its sidecar under the flavor's lock.
func packAndPublish(ctx context.Context, paths paths.Paths, root string, info *BaseInfo) error {
	dst := BasePath(paths, info.Flavor)
	tmp := filepath.Join(filepath.Dir(root), "image.sqfs")
	if err := mksquashfs(ctx, root, tmp); err != nil {
		return err
	}
	sum, err := sha256File(tmp)
	if err != nil {
		return err
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	info.ContentSHA256 = sum
	info.Size = fi.Size()
	info.ProtocolVersion = agentproto.Version
	info.Recipe = baseRecipes[info.Flavor]
	info.BuiltUnix = time.Now().Unix()
	info.Path = dst
	unlock, err := lock(paths, info.Flavor)
	if err != nil {
		return err
	}
	defer unlock()
	if err := publishFile(tmp, dst); err != nil {
		return err
	}
	return writeJSONAtomic(sidecarPath(dst), info)
}

// currentBase returns the published sidecar of flavor when it was made by
// this isopod's recipe and matches inputs (nil inputs: any). A base holds
// no part of isopod, so another protocol version does not rebuild it.
func currentBase(paths paths.Paths, flavor string, inputs []Pin) (BaseInfo, bool) {
	var info BaseInfo
	p := BasePath(paths, flavor)
	if err := readJSON(sidecarPath(p), &info); err != nil {
		return BaseInfo{}, false
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != info.Size || info.Recipe != baseRecipes[flavor] {
		return BaseInfo{}, false
	}
	if inputs != nil {
		if len(inputs) != len(info.Inputs) {
			return BaseInfo{}, false
		}
		for i := range inputs {
			if inputs[i] != info.Inputs[i] {
				return BaseInfo{}, false
			}
		}
	}
	info.Path, info.Cached = p, true
	return info, true
}
