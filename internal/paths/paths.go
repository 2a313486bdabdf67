// Package paths lays out isopod's state root ($ISOPOD_HOME, by default
// ~/.isopod). It only names directories; which root is used is decided once
// by the front ends (internal/config).
package paths

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
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
//	ledger/                the VM places each live process holds (internal/ledger)
type Paths struct {
	Home string
}

// New returns the layout under home, made absolute.
func New(home string) (Paths, error) {
	abs, err := filepath.Abs(home)
	if err != nil {
		return Paths{}, fmt.Errorf("resolving state root %q: %w", home, err)
	}
	return Paths{Home: abs}, nil
}

func (p Paths) Kernels() string     { return filepath.Join(p.Home, "kernels") }
func (p Paths) Images() string      { return filepath.Join(p.Home, "images") }
func (p Paths) VMs() string         { return filepath.Join(p.Home, "vms") }
func (p Paths) VM(id string) string { return filepath.Join(p.Home, "vms", id) }
func (p Paths) Stages() string      { return filepath.Join(p.Home, "stages") }
func (p Paths) Snapshots() string   { return filepath.Join(p.Home, "snapshots") }
func (p Paths) Locks() string       { return filepath.Join(p.Home, "locks") }
func (p Paths) Ledger() string      { return filepath.Join(p.Home, "ledger") }

// Scope is a short tag of the state root (8 hex digits of a hash of its
// path), for names that several roots share a namespace for, such as the
// VMMs' cgroups.
func (p Paths) Scope() string {
	sum := sha256.Sum256([]byte(p.Home))
	return hex.EncodeToString(sum[:4])
}

// Ensure creates the state directories (mode 0700).
func (p Paths) Ensure() error {
	for _, d := range []string{p.Home, p.Kernels(), p.Images(), p.VMs(), p.Stages(), p.Snapshots(), p.Locks()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating state directory: %w", err)
		}
	}
	return nil
}

// DirBytes is the allocated size of everything under dir (0 when it cannot
// be read).
func DirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
