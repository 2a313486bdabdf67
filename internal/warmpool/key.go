// Package warmpool is the warm pool's snapshot catalog: one memory snapshot
// of a booted, idle VM per key under snapshots/<key>/, with the locks that
// let many isopod processes build, resume from, replace and retire them at
// once.
//
// The catalog does not know how a key is computed or how a snapshot is
// made or resumed: the run lifecycle (internal/sandbox) computes the current
// key from the host, the images and the VMM driver, builds snapshots with
// the driver, and passes both in. The catalog only keeps them.
//
// Files: the VMM's own snapshot files plus MetaFile, written last, so a
// directory without it is incomplete. Builders write into a temporary
// directory (.tmp-<key>-<rand>) and Publish renames it into place; a
// replaced or retired snapshot is first renamed to .old-<key>-<rand>, then
// removed.
//
// Locks (under locks/): warm-<key>.build is held by the one builder of a
// key; warm-<key>.lock is held shared by every run while its VMM loads the
// snapshot, and exclusively by whoever renames the snapshot away.
package warmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
)

// KeyPrefix starts every key (and so every snapshot directory name).
const KeyPrefix = "wk-"

// Key is everything a snapshot depends on. Any change gives another ID, so
// the next eligible run builds a new snapshot.
type Key struct {
	Format      int    `json:"format"`
	VMM         string `json:"vmm"`          // VMM binary identity
	HostKernel  string `json:"host_kernel"`  // release and build
	CPUModel    string `json:"cpu_model"`    // model name and a digest of the flags
	Accel       string `json:"accel"`        // kvm or tcg
	GuestKernel string `json:"guest_kernel"` // digest or file identity
	Initramfs   string `json:"initramfs"`    // content digest (holds the agent)
	Base        string `json:"base"`
	BaseSHA256  string `json:"base_sha256"`
	VCPUs       int    `json:"vcpus"`
	MemMiB      int    `json:"mem_mib"`
	// NIC: the snapshot VM has a network interface (every run but
	// --no-network ones).
	NIC      bool `json:"nic"`
	Protocol int  `json:"protocol"`
	// An assembled snapshot's VM has its root already assembled: the base,
	// the stage layers Layers (stage ids, root first) and a scratch disk
	// of ScratchMiB. Zero for the plain snapshot of a shape, whose root
	// each run assembles after the resume (omitted, so a plain key's ID
	// does not change).
	Assembled  bool     `json:"assembled,omitempty"`
	Layers     []string `json:"layers,omitempty"`
	ScratchMiB int      `json:"scratch_mib,omitempty"`
}

// Plain is the key of k's shape without an assembled root.
func (k Key) Plain() Key {
	k.Assembled, k.Layers, k.ScratchMiB = false, nil, 0
	return k
}

// WithRoot is k's key of a snapshot whose root is assembled from the
// stages layers (ids, root first) and a scratch disk of scratchMiB.
func (k Key) WithRoot(layers []string, scratchMiB int) Key {
	k.Assembled, k.Layers, k.ScratchMiB = true, append([]string(nil), layers...), scratchMiB
	return k
}

// ID is the key's directory name: wk- and 16 hex digits of its digest.
func (k Key) ID() string {
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return KeyPrefix + hex.EncodeToString(sum[:8])
}

// Diff names the parts in which k and o differ.
func (k Key) Diff(o Key) []string {
	var d []string
	add := func(name string, differ bool) {
		if differ {
			d = append(d, name)
		}
	}
	add("format", k.Format != o.Format)
	add("vmm", k.VMM != o.VMM)
	add("host kernel", k.HostKernel != o.HostKernel)
	add("cpu model", k.CPUModel != o.CPUModel)
	add("accel", k.Accel != o.Accel)
	add("guest kernel", k.GuestKernel != o.GuestKernel)
	add("initramfs", k.Initramfs != o.Initramfs)
	add("base build", k.Base != o.Base || k.BaseSHA256 != o.BaseSHA256)
	add("vcpus", k.VCPUs != o.VCPUs)
	add("memory", k.MemMiB != o.MemMiB)
	add("network", k.NIC != o.NIC)
	add("protocol", k.Protocol != o.Protocol)
	add("root", k.Assembled != o.Assembled || k.ScratchMiB != o.ScratchMiB || !slices.Equal(k.Layers, o.Layers))
	return d
}

// HostKernel names the running host kernel: its release and build.
func HostKernel() string {
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	ver, _ := os.ReadFile("/proc/sys/kernel/version")
	return strings.TrimSpace(string(rel)) + " " + strings.TrimSpace(string(ver))
}

// CPUModel is the first CPU's model name and a digest of its flags.
func CPUModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	var model, flags string
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "flags":
			if flags == "" {
				flags = strings.TrimSpace(v)
			}
		}
		if model != "" && flags != "" {
			break
		}
	}
	sum := sha256.Sum256([]byte(flags))
	return model + " flags:" + hex.EncodeToString(sum[:4])
}
