// Package config knows where isopod keeps its state and which environment
// knobs it reads. Every environment variable isopod honours is named here.
package config

import (
	"fmt"
	"os"
	"path/filepath"
)

// Environment knobs.
const (
	EnvHome          = "ISOPOD_HOME"            // state root; default ~/.isopod
	EnvKernel        = "ISOPOD_KERNEL"          // a kernel with every driver built in
	EnvQEMU          = "ISOPOD_QEMU"            // qemu-system-x86_64 to use
	EnvAgentBin      = "ISOPOD_AGENT_BIN"       // isopod-agent binary for image builds
	EnvAccel         = "ISOPOD_ACCEL"           // force "kvm" or "tcg"
	EnvAllowBaseSkew = "ISOPOD_ALLOW_BASE_SKEW" // "1": fork stages made over another base build
	EnvLogLevel      = "ISOPOD_LOG"             // debug|info|warn|error (stderr)
	EnvMCPHostIORoot = "ISOPOD_MCP_HOST_IO_ROOT"
	EnvMCPCopyOut    = "ISOPOD_MCP_COPY_OUT"
	EnvMCPStdinFile  = "ISOPOD_MCP_STDIN_FILE"
)

// Paths lays out the state root.
//
//	kernels/<version>/     vmlinuz, modules/, kernel.json (version, sha256)
//	images/                initramfs-*.cpio, base-*.sqfs and their .json sidecars,
//	                       scratch templates
//	vms/<id>/              record.json, vmm.pid, console.log, stdout.log, stderr.log,
//	                       net.jsonl, egress.jsonl
//	stages/<id>/           layer.ext4, meta.json
//	snapshots/<key>/       warm-pool snapshots
//	locks/                 lock files for shared state
type Paths struct {
	Home string
}

// DefaultPaths resolves the state root from $ISOPOD_HOME or the home directory.
func DefaultPaths() (Paths, error) {
	if h := os.Getenv(EnvHome); h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return Paths{}, fmt.Errorf("resolving %s: %w", EnvHome, err)
		}
		return Paths{Home: abs}, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return Paths{}, fmt.Errorf("finding home directory (set %s): %w", EnvHome, err)
	}
	return Paths{Home: filepath.Join(home, ".isopod")}, nil
}

func (p Paths) Kernels() string     { return filepath.Join(p.Home, "kernels") }
func (p Paths) Images() string      { return filepath.Join(p.Home, "images") }
func (p Paths) VMs() string         { return filepath.Join(p.Home, "vms") }
func (p Paths) VM(id string) string { return filepath.Join(p.Home, "vms", id) }
func (p Paths) Stages() string      { return filepath.Join(p.Home, "stages") }
func (p Paths) Snapshots() string   { return filepath.Join(p.Home, "snapshots") }
func (p Paths) Locks() string       { return filepath.Join(p.Home, "locks") }

// Ensure creates the state directories (mode 0700).
func (p Paths) Ensure() error {
	for _, d := range []string{p.Home, p.Kernels(), p.Images(), p.VMs(), p.Stages(), p.Snapshots(), p.Locks()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating state directory: %w", err)
		}
	}
	return nil
}
