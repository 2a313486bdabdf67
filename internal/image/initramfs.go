package image

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/image/cpio"
	"isopod/internal/knobs"
	"isopod/internal/paths"
)

// Flavor names of what Build makes.
const (
	FlavorInitramfs  = "initramfs"
	FlavorBaseMin    = "base-min"
	FlavorBaseDebian = "base-debian"
)

// BuildOptions tunes the image builds.
type BuildOptions struct {
	Logger *slog.Logger
	// Apt runs apt-get and apt-cache; nil finds them on PATH.
	Apt *Apt
	// AgentBin overrides LocateAgent's search.
	AgentBin string
	// Kernel overrides the kernel the initramfs is made for (as --kernel).
	Kernel string
	// Force rebuilds even when the existing build is current.
	Force bool
	// Mirror overrides the Debian mirror base-debian is bootstrapped from
	// and base-min's busybox is fetched from; default: the host's
	// configured apt sources (base-min: then DefaultDebianMirror).
	Mirror string
	// HTTPClient fetches packages pinned by pool path; nil: a client that
	// takes no proxy from the environment.
	HTTPClient *http.Client
}

// InitramfsInfo is the initramfs sidecar (images/initramfs*.json).
type InitramfsInfo struct {
	BuiltInKernel   bool     `json:"builtin_kernel"`
	KernelVersion   string   `json:"kernel_version,omitempty"`
	KernelRelease   string   `json:"kernel_release,omitempty"`
	KernelSHA256    string   `json:"kernel_sha256,omitempty"`
	Modules         []string `json:"modules"` // in-initramfs paths, load order
	AgentSHA256     string   `json:"agent_sha256"`
	ProtocolVersion int      `json:"protocol_version"`
	ContentSHA256   string   `json:"content_sha256"`
	Size            int64    `json:"size"`
	BuiltUnix       int64    `json:"built_unix"`

	Path   string `json:"-"`
	Cached bool   `json:"-"`
}

// ModulesListPath is where the initramfs lists its modules for the agent.
const ModulesListPath = "etc/isopod/modules"

// InitramfsPath is the initramfs for a kernel: one with modules for a
// fetched kernel, one without for a kernel with every driver built in.
func InitramfsPath(paths paths.Paths, builtIn bool) string {
	if builtIn {
		return filepath.Join(paths.Images(), "initramfs-builtin.cpio")
	}
	return filepath.Join(paths.Images(), "initramfs.cpio")
}

func sidecarPath(artifact string) string {
	return strings.TrimSuffix(artifact, filepath.Ext(artifact)) + ".json"
}

// BuildInitramfs writes the initramfs for the resolved kernel: the agent at
// /init, the kernel's modules and their load order.
func BuildInitramfs(ctx context.Context, paths paths.Paths, opts BuildOptions) (InitramfsInfo, error) {
	log := logger(opts.Logger)
	bk, err := ResolveKernel(paths, opts.Kernel)
	if err != nil {
		return InitramfsInfo{}, err
	}
	agent, err := readAgent(opts.AgentBin)
	if err != nil {
		return InitramfsInfo{}, err
	}
	info := newInitramfsInfo(paths, bk, agent)
	if err := os.MkdirAll(paths.Images(), 0o755); err != nil {
		return InitramfsInfo{}, fmt.Errorf("creating images directory: %w", err)
	}
	unlock, err := lock(paths, FlavorInitramfs)
	if err != nil {
		return InitramfsInfo{}, err
	}
	defer unlock()
	if !bk.BuiltIn {
		// A kernel fetched before isopod took the uncompressed kernel out
		// of its bzImage gets it here.
		tryVMLinux(bk.Path, bk.Info.SHA256, filepath.Dir(bk.Path), log)
	}
	if !opts.Force {
		if old, ok := currentInitramfs(info, bk); ok {
			log.Info("initramfs is current", "path", old.Path)
			return old, nil
		}
	}

	out, err := buildInitramfsArchive(bk, agent, &info)
	if err != nil {
		return InitramfsInfo{}, err
	}
	info.ContentSHA256 = sha256Bytes(out)
	info.Size = int64(len(out))
	info.BuiltUnix = time.Now().Unix()
	if err := writeFileAtomic(info.Path, out, 0o644); err != nil {
		return InitramfsInfo{}, err
	}
	if err := writeJSONAtomic(sidecarPath(info.Path), info); err != nil {
		return InitramfsInfo{}, err
	}
	log.Info("initramfs built", "path", info.Path, "size", info.Size, "modules", len(info.Modules), "builtin_kernel", info.BuiltInKernel)
	return info, nil
}

// readAgent reads the agent binary that becomes /init (see LocateAgent).
func readAgent(agentBin string) ([]byte, error) {
	agentPath, err := LocateAgent(agentBin)
	if err != nil {
		return nil, err
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return nil, fmt.Errorf("reading agent: %w", err)
	}
	return agent, nil
}

// newInitramfsInfo describes the initramfs of agent and kernel bk, before
// it is built: no modules, content digest, size or build time yet.
func newInitramfsInfo(paths paths.Paths, bk BootKernel, agent []byte) InitramfsInfo {
	info := InitramfsInfo{
		BuiltInKernel:   bk.BuiltIn,
		AgentSHA256:     sha256Bytes(agent),
		ProtocolVersion: agentproto.Version,
		Modules:         []string{},
		Path:            InitramfsPath(paths, bk.BuiltIn),
	}
	if !bk.BuiltIn {
		info.KernelVersion = bk.Info.Version
		info.KernelRelease = bk.Info.KernelRelease
		info.KernelSHA256 = bk.Info.SHA256
	}
	return info
}

// currentInitramfs returns the existing initramfs at info.Path when it was
// built from the same agent, protocol, kernel and modules and its content
// is intact.
func currentInitramfs(info InitramfsInfo, bk BootKernel) (InitramfsInfo, bool) {
	var old InitramfsInfo
	if err := readJSON(sidecarPath(info.Path), &old); err == nil && old.AgentSHA256 == info.AgentSHA256 &&
		old.ProtocolVersion == info.ProtocolVersion && old.KernelSHA256 == info.KernelSHA256 &&
		sameModules(old.Modules, bk.Info.Modules) {
		if sum, err := sha256File(info.Path); err == nil && sum == old.ContentSHA256 {
			old.Path, old.Cached = info.Path, true
			return old, true
		}
	}
	return InitramfsInfo{}, false
}

// buildInitramfsArchive makes the cpio archive: the base directories,
// /dev/console, the agent as /init and bk's modules with their list. It
// appends the modules' in-initramfs paths to info.Modules.
func buildInitramfsArchive(bk BootKernel, agent []byte, info *InitramfsInfo) ([]byte, error) {
	b := cpio.NewBuilder()
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "etc", "etc/isopod"} {
		perm := os.FileMode(0o755)
		if d == "tmp" {
			perm = 0o1777
		}
		if err := b.AddDir(d, perm); err != nil {
			return nil, err
		}
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs exists.
	if err := b.AddCharDev("dev/console", 0o600, 5, 1); err != nil {
		return nil, err
	}
	if err := b.AddFile("init", 0o755, agent); err != nil {
		return nil, err
	}
	if err := addModules(b, bk, info); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if _, err := b.WriteTo(&out); err != nil {
		return nil, fmt.Errorf("writing initramfs: %w", err)
	}
	return out.Bytes(), nil
}

// addModules adds bk's modules under /lib/modules/<release> and their load
// order at ModulesListPath, appending their paths to info.Modules.
func addModules(b *cpio.Builder, bk BootKernel, info *InitramfsInfo) error {
	var list bytes.Buffer
	for i, hostPath := range bk.Modules {
		data, err := os.ReadFile(hostPath)
		if err != nil {
			return fmt.Errorf("reading module (re-run `isopod image fetch-kernel --force`): %w", err)
		}
		inPath := path.Join("/lib/modules", bk.Info.KernelRelease, bk.Info.Modules[i])
		if err := b.AddFile(inPath, 0o644, data); err != nil {
			return err
		}
		info.Modules = append(info.Modules, inPath)
		list.WriteString(inPath + "\n")
	}
	return b.AddFile(ModulesListPath, 0o644, list.Bytes())
}

// Boot is what a guest boots from.
type Boot struct {
	Kernel        string // kernel image
	BzImage       string // the compressed kernel Kernel was taken from; "": Kernel is it
	Initramfs     string
	BuiltInKernel bool
	KernelVersion string // "" for a built-in kernel
	Info          InitramfsInfo
}

// ResolveBoot picks the kernel (see ResolveKernel) and its initramfs, and
// refuses an initramfs that is missing, made for another kernel, or speaks
// another protocol version.
func ResolveBoot(paths paths.Paths, kernelOverride string) (Boot, error) {
	bk, err := ResolveKernel(paths, kernelOverride)
	if err != nil {
		return Boot{}, err
	}
	p := InitramfsPath(paths, bk.BuiltIn)
	unlock, err := rlock(paths, FlavorInitramfs)
	if err != nil {
		return Boot{}, err
	}
	defer unlock()
	hint := "run `isopod image build initramfs`"
	if bk.BuiltIn {
		hint += " with the same --kernel or " + knobs.Kernel
	}
	var info InitramfsInfo
	if err := readJSON(sidecarPath(p), &info); err != nil {
		return Boot{}, fmt.Errorf("initramfs %s is not built: %s (or `isopod image build-all`): %w", p, hint, errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat(p); err != nil {
		return Boot{}, fmt.Errorf("initramfs %s is missing: %s: %w", p, hint, errdefs.ErrFailedPrecondition)
	}
	if info.ProtocolVersion != agentproto.Version {
		return Boot{}, fmt.Errorf("initramfs agent speaks protocol %d, isopod speaks %d: rebuild it: %s: %w",
			info.ProtocolVersion, agentproto.Version, hint, errdefs.ErrFailedPrecondition)
	}
	if !bk.BuiltIn && info.KernelSHA256 != bk.Info.SHA256 {
		return Boot{}, fmt.Errorf("initramfs was made for kernel %s, the guest kernel is %s: %s: %w",
			info.KernelVersion, bk.Info.Version, hint, errdefs.ErrFailedPrecondition)
	}
	info.Path = p
	kernel, bz := bk.Path, ""
	if !bk.BuiltIn {
		kernel = bootKernel(bk.Path, bk.Info.SHA256)
	}
	if kernel != bk.Path {
		bz = bk.Path
	}
	return Boot{Kernel: kernel, BzImage: bz, Initramfs: p, BuiltInKernel: bk.BuiltIn, KernelVersion: bk.Info.Version, Info: info}, nil
}

// sameModules reports whether an initramfs's module list (in-initramfs
// paths) names the same modules, in the same order, as the kernel's list.
func sameModules(built, kernel []string) bool {
	if len(built) != len(kernel) {
		return false
	}
	for i := range built {
		if filepath.Base(built[i]) != filepath.Base(kernel[i]) {
			return false
		}
	}
	return true
}
