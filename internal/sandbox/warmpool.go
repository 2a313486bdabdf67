package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/config"
	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/vmm"
	"isopod/internal/vmm/qemu"
)

// The warm pool keeps, per key, one memory snapshot of a booted, idle VM
// (agent ready, nothing run) under snapshots/<key>/. Eligible runs resume
// from it instead of booting.
//
// Layout decision: a snapshot VM has the base disk and a NIC but no scratch
// disk, and boots with isopod.upper=ram, so its overlay upper is a tmpfs in
// guest RAM. A resumed VM maps the snapshot's RAM privately (copy-on-write),
// so its writes live in its own memory and no run ever sees another's. Warm
// runs never commit, so nothing needs a scratch disk.
//
// Files: the VMM's own snapshot files plus warmMetaFile, written last, so a
// directory without it is incomplete. Builders write to .tmp-<key>-<rand>
// and rename into place; a replaced or retired snapshot is first renamed to
// .old-<key>-<rand>, then removed.
//
// Locks (under locks/): warm-<key>.build is held by the one builder of a key;
// warm-<key>.lock is held shared by every run while its VMM loads the
// snapshot and exclusively by whoever renames the snapshot away.
const (
	// warmFormat is the snapshot layout version; bump it when the snapshot
	// VM's configuration (disks, command line, NIC) changes.
	warmFormat = 2
	// warmHostname is the snapshot VM's boot hostname; every resumed run
	// sets its own.
	warmHostname  = "isopod-warm"
	warmMetaFile  = "warm.json"
	warmKeyPrefix = "wk-"
	warmTmpPrefix = ".tmp-"
	warmOldPrefix = ".old-"
	// warmEntropyBytes is how much host randomness a resumed guest gets.
	warmEntropyBytes = 64
)

// WarmKey is everything a snapshot depends on. Any change gives another key,
// so the next eligible run builds a new snapshot.
type WarmKey struct {
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
	Protocol    int    `json:"protocol"`
}

// ID is the key's directory name: wk- and 16 hex digits of its digest.
func (k WarmKey) ID() string {
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return warmKeyPrefix + hex.EncodeToString(sum[:8])
}

// diff names the fields in which k and o differ.
func (k WarmKey) diff(o WarmKey) []string {
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
	add("protocol", k.Protocol != o.Protocol)
	return d
}

// warmMeta is snapshots/<key>/warm.json.
type warmMeta struct {
	Key     string    `json:"key"`
	Parts   WarmKey   `json:"parts"`
	BuildID string    `json:"build_id"` // tells a rebuilt snapshot from the one a run tried
	Built   time.Time `json:"built"`
	BuildMS int64     `json:"build_ms"`
	Accel   vmm.Accel `json:"accel"`
	VMM     vmm.Info  `json:"vmm"` // the build's; the key pins the binary
}

// warmInputs are a key's parts that do not depend on the run's sizes.
type warmInputs struct {
	key WarmKey
	// kernel files the snapshot VM boots.
	kernel kernelFiles
	base   baseImage
}

// warmKeyFor computes the key of base with sizes vcpus and memMiB.
func (s *Service) warmKeyFor(ctx context.Context, base baseImage, vcpus, memMiB int) (warmInputs, error) {
	boot, err := image.ResolveBoot(s.opts.Paths, os.Getenv(config.EnvKernel))
	if err != nil {
		return warmInputs{}, err
	}
	k := WarmKey{
		Format:     warmFormat,
		HostKernel: hostKernelID(),
		CPUModel:   cpuModelID(),
		Accel:      s.expectedAccel(),
		Initramfs:  boot.Info.ContentSHA256,
		Base:       base.Flavor,
		BaseSHA256: base.SHA256,
		VCPUs:      vcpus,
		MemMiB:     memMiB,
		Protocol:   agentproto.Version,
	}
	if boot.BuiltInKernel {
		k.GuestKernel = fileIdentity(boot.Kernel)
	} else {
		k.GuestKernel = "sha256:" + boot.Info.KernelSHA256
	}
	if k.VMM, err = s.vmmIdentity(ctx); err != nil {
		return warmInputs{}, err
	}
	return warmInputs{key: k, kernel: kernelFiles{Kernel: boot.Kernel, Initramfs: boot.Initramfs}, base: base}, nil
}

// fileIdentity names a file by path, size and modification time.
func fileIdentity(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return path + ":missing"
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}

// vmmIdentity names the VMM binary without running it: QEMU is found the
// way the driver finds it; another driver reports its Info.
func (s *Service) vmmIdentity(ctx context.Context) (string, error) {
	if s.opts.Driver != nil {
		if _, isQEMU := s.opts.Driver.(*qemu.Driver); !isQEMU {
			info, err := s.opts.Driver.Info(ctx)
			if err != nil {
				return "", err
			}
			return info.Name + " " + info.Version + " " + info.Path, nil
		}
	}
	bin := os.Getenv(config.EnvQEMU)
	if bin == "" {
		bin = qemu.DefaultBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("warm pool: finding %s: %w", bin, errdefs.ErrNotFound)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	return "qemu " + fileIdentity(path), nil
}

func hostKernelID() string {
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	ver, _ := os.ReadFile("/proc/sys/kernel/version")
	return strings.TrimSpace(string(rel)) + " " + strings.TrimSpace(string(ver))
}

// cpuModelID is the first CPU's model name and a digest of its flags.
func cpuModelID() string {
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

// expectedAccel predicts the accelerator a boot gets: the forced one, else
// KVM when /dev/kvm opens and the driver's probe found it boots, else TCG.
// A build records what it actually got, so a wrong guess costs one rebuild.
func (s *Service) expectedAccel() string {
	if env := os.Getenv(config.EnvAccel); env != "" {
		return env
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return string(vmm.AccelTCG)
	}
	unix.Close(fd)
	var probe struct {
		KVM bool `json:"kvm"`
	}
	b, err := os.ReadFile(filepath.Join(s.opts.Paths.Home, "accel-probe.json"))
	if err == nil && json.Unmarshal(b, &probe) == nil && probe.KVM {
		return string(vmm.AccelKVM)
	}
	return string(vmm.AccelTCG)
}

// warmDir is where key's snapshot lives.
func (s *Service) warmDir(key string) string { return filepath.Join(s.opts.Paths.Snapshots(), key) }

func (s *Service) warmLockPath(key, kind string) string {
	return filepath.Join(s.opts.Paths.Locks(), "warm-"+key+"."+kind)
}

// readWarm reads a complete snapshot's metadata; an error means there is no
// usable snapshot in dir.
func readWarm(dir string) (*warmMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, warmMetaFile))
	if err != nil {
		return nil, err
	}
	m := new(warmMeta)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, warmMetaFile), err)
	}
	if m.Key != filepath.Base(dir) {
		return nil, fmt.Errorf("%s: records key %s: %w", dir, m.Key, errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// publishWarm moves a finished snapshot from tmp to key's place, replacing
// (and then removing) a previous one. Runs loading the previous one finish
// first: the rename waits for the exclusive lock.
func (s *Service) publishWarm(tmp, key string) error {
	lk := flock.New(s.warmLockPath(key, "lock"))
	if err := lk.Lock(); err != nil {
		return fmt.Errorf("warm pool: locking %s: %w", key, err)
	}
	dir := s.warmDir(key)
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = filepath.Join(s.opts.Paths.Snapshots(), warmOldPrefix+key+"-"+randomHex(4))
		if err := os.Rename(dir, old); err != nil {
			lk.Unlock()
			return fmt.Errorf("warm pool: replacing %s: %w", key, err)
		}
	}
	err := os.Rename(tmp, dir)
	lk.Unlock()
	if old != "" {
		os.RemoveAll(old)
	}
	if err != nil {
		return fmt.Errorf("warm pool: publishing %s: %w", key, err)
	}
	return nil
}

// retireWarm removes key's snapshot if it is still the build buildID ("":
// whatever is there). It reports whether it removed one.
func (s *Service) retireWarm(key, buildID string) (bool, int64) {
	lk := flock.New(s.warmLockPath(key, "lock"))
	if err := lk.Lock(); err != nil {
		return false, 0
	}
	dir := s.warmDir(key)
	if buildID != "" {
		if m, err := readWarm(dir); err == nil && m.BuildID != buildID {
			lk.Unlock()
			return false, 0
		}
	}
	if _, err := os.Lstat(dir); err != nil {
		lk.Unlock()
		return false, 0
	}
	freed := dirBytes(dir)
	old := filepath.Join(s.opts.Paths.Snapshots(), warmOldPrefix+key+"-"+randomHex(4))
	err := os.Rename(dir, old)
	lk.Unlock()
	if err != nil {
		s.log.Warn("warm pool: retiring snapshot", "key", key, "err", err)
		return false, 0
	}
	os.RemoveAll(old)
	return true, freed
}

// WarmEntry describes one warm-pool snapshot.
type WarmEntry struct {
	Key        string    `json:"key"`
	Base       string    `json:"base"`
	BaseSHA256 string    `json:"base_sha256"`
	VCPUs      int       `json:"vcpus"`
	MemMiB     int       `json:"mem_mib"`
	Accel      vmm.Accel `json:"accel"`
	Built      string    `json:"built"`
	BuildMS    int64     `json:"build_ms"`
	Allocated  int64     `json:"allocated_bytes"`
	Path       string    `json:"path"`
	// Stale: an eligible run with these sizes would use another key now.
	Stale       bool   `json:"stale"`
	StaleReason string `json:"stale_reason,omitempty"`
}

type WarmListResult struct {
	OK        bool        `json:"ok"`
	Snapshots []WarmEntry `json:"snapshots"`
}

type WarmRemoveResult struct {
	OK         bool     `json:"ok"`
	Removed    []string `json:"removed"`
	FreedBytes int64    `json:"freed_bytes"`
}

// WarmList lists the snapshots, newest first, and says which are stale.
func (s *Service) WarmList(ctx context.Context) (*WarmListResult, error) {
	res := &WarmListResult{OK: true, Snapshots: []WarmEntry{}}
	ents, _ := os.ReadDir(s.opts.Paths.Snapshots())
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), warmKeyPrefix) {
			continue
		}
		dir := s.warmDir(e.Name())
		m, err := readWarm(dir)
		if err != nil {
			continue
		}
		ent := WarmEntry{
			Key: m.Key, Base: m.Parts.Base, BaseSHA256: m.Parts.BaseSHA256, VCPUs: m.Parts.VCPUs, MemMiB: m.Parts.MemMiB,
			Accel: m.Accel, Built: m.Built.Format(time.RFC3339), BuildMS: m.BuildMS, Allocated: dirBytes(dir), Path: dir,
		}
		if why := s.warmStale(ctx, m); why != "" {
			ent.Stale, ent.StaleReason = true, why
		}
		res.Snapshots = append(res.Snapshots, ent)
	}
	sort.Slice(res.Snapshots, func(i, j int) bool { return res.Snapshots[i].Built > res.Snapshots[j].Built })
	return res, nil
}

// warmStale says why m would not be used by an eligible run of its sizes
// now ("" when it would).
func (s *Service) warmStale(ctx context.Context, m *warmMeta) string {
	base, err := s.lookupBase(m.Parts.Base)
	if err != nil {
		return "base " + m.Parts.Base + " is not usable: " + err.Error()
	}
	in, err := s.warmKeyFor(ctx, base, m.Parts.VCPUs, m.Parts.MemMiB)
	if err != nil {
		return err.Error()
	}
	if d := in.key.diff(m.Parts); len(d) > 0 {
		return "changed since the build: " + strings.Join(d, ", ")
	}
	return ""
}

// WarmRemove removes one snapshot by key, or all of them.
func (s *Service) WarmRemove(ctx context.Context, key string, all bool) (*WarmRemoveResult, error) {
	switch {
	case all && key != "":
		return nil, invalid("warmpool rm: give a KEY or --all, not both")
	case !all && key == "":
		return nil, invalid("warmpool rm: give a KEY (see `isopod warmpool list`) or --all")
	case !all && (!strings.HasPrefix(key, warmKeyPrefix) || strings.ContainsAny(key, "/.")):
		return nil, invalid("warmpool rm %q: a key looks like wk-0123456789abcdef (see `isopod warmpool list`)", key)
	}
	res := &WarmRemoveResult{OK: true, Removed: []string{}}
	keys := []string{key}
	if all {
		keys = nil
		ents, _ := os.ReadDir(s.opts.Paths.Snapshots())
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), warmKeyPrefix) {
				keys = append(keys, e.Name())
			}
		}
	}
	for _, k := range keys {
		if ok, freed := s.retireWarm(k, ""); ok {
			res.Removed = append(res.Removed, k)
			res.FreedBytes += freed
		}
	}
	if !all && len(res.Removed) == 0 {
		return nil, fmt.Errorf("warmpool rm %s: no such snapshot (see `isopod warmpool list`): %w", key, errdefs.ErrNotFound)
	}
	return res, nil
}

// gcWarm removes leftovers: temporary and replaced snapshot directories
// nobody is building, incomplete ones, and snapshots whose base build is
// gone or was rebuilt. It returns the names removed.
func (s *Service) gcWarm() []string {
	var removed []string
	root := s.opts.Paths.Snapshots()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(root, name)
		switch {
		case strings.HasPrefix(name, warmOldPrefix):
			os.RemoveAll(path)
			removed = append(removed, name)
		case strings.HasPrefix(name, warmTmpPrefix):
			key := tmpKey(name)
			lk := flock.New(s.warmLockPath(key, "build"))
			ok, err := lk.TryLock()
			if err != nil || !ok {
				continue // its builder is still at work
			}
			os.RemoveAll(path)
			lk.Unlock()
			removed = append(removed, name)
		case strings.HasPrefix(name, warmKeyPrefix):
			m, err := readWarm(path)
			why := ""
			switch {
			case err != nil:
				why = "incomplete"
			default:
				if b, err := s.lookupBase(m.Parts.Base); err != nil || b.SHA256 != m.Parts.BaseSHA256 {
					why = "base build gone"
				} else if m.Parts.Protocol != agentproto.Version || m.Parts.Format != warmFormat {
					why = "format or protocol changed"
				} else {
					why = s.warmDead(b, m)
				}
			}
			if why == "" {
				continue
			}
			if ok, _ := s.retireWarm(name, ""); ok {
				s.log.Info("warm pool: removed snapshot", "key", name, "why", why)
				removed = append(removed, name)
			}
		}
	}
	return removed
}

// warmDead says why m can never be used again ("" when it may be): the
// host kernel or CPU changed, or the fetched guest kernel's initramfs was
// rebuilt. Parts that follow the environment of one call (ISOPOD_ACCEL,
// ISOPOD_KERNEL, ISOPOD_QEMU) never make a snapshot dead.
func (s *Service) warmDead(base baseImage, m *warmMeta) string {
	in, err := s.warmKeyFor(context.Background(), base, m.Parts.VCPUs, m.Parts.MemMiB)
	if err != nil {
		return ""
	}
	fetched := strings.HasPrefix(m.Parts.GuestKernel, "sha256:") && strings.HasPrefix(in.key.GuestKernel, "sha256:")
	for _, d := range in.key.diff(m.Parts) {
		if d == "host kernel" || d == "cpu model" || (fetched && (d == "initramfs" || d == "guest kernel")) {
			return d + " changed"
		}
	}
	return ""
}

// tmpKey extracts the key from .tmp-<key>-<rand>.
func tmpKey(name string) string {
	rest := strings.TrimPrefix(name, warmTmpPrefix)
	if i := strings.LastIndexByte(rest, '-'); i > 0 {
		return rest[:i]
	}
	return rest
}

// errWarmUnusable marks a snapshot that could not be resumed.
var errWarmUnusable = errors.New("warm snapshot unusable")
