package warmpool

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
	"isopod/internal/paths"

	"errors"
)

func sampleKey() Key {
	return Key{
		Format: 2, VMM: "qemu /usr/bin/qemu:1:2", HostKernel: "6.1", CPUModel: "cpu flags:00",
		Accel: "tcg", GuestKernel: "sha256:aa", Initramfs: "bb", Base: "base-min", BaseSHA256: "cc",
		VCPUs: 1, MemMiB: 512, Protocol: 1,
	}
}

func TestKeyChangesWithEveryPart(t *testing.T) {
	k := sampleKey()
	id := k.ID()
	if id != sampleKey().ID() || !strings.HasPrefix(id, KeyPrefix) || len(id) != len(KeyPrefix)+16 {
		t.Fatalf("ID %q: not stable or not wk-<16 hex>", id)
	}
	changes := map[string]func(*Key){
		"format":       func(k *Key) { k.Format++ },
		"vmm":          func(k *Key) { k.VMM += "x" },
		"host kernel":  func(k *Key) { k.HostKernel += "x" },
		"cpu model":    func(k *Key) { k.CPUModel += "x" },
		"accel":        func(k *Key) { k.Accel = "kvm" },
		"guest kernel": func(k *Key) { k.GuestKernel += "x" },
		"initramfs":    func(k *Key) { k.Initramfs += "x" },
		"base build":   func(k *Key) { k.BaseSHA256 += "x" },
		"vcpus":        func(k *Key) { k.VCPUs = 2 },
		"memory":       func(k *Key) { k.MemMiB = 256 },
		"network":      func(k *Key) { k.NIC = !k.NIC },
		"protocol":     func(k *Key) { k.Protocol++ },
	}
	for name, change := range changes {
		o := sampleKey()
		change(&o)
		if o.ID() == id {
			t.Errorf("changing %s keeps the key", name)
		}
		if d := k.Diff(o); len(d) != 1 || d[0] != name {
			t.Errorf("changing %s: diff says %v", name, d)
		}
	}
}

func TestHostParts(t *testing.T) {
	if rel, build, _ := strings.Cut(HostKernel(), " "); rel == "" || build == "" {
		t.Errorf("host kernel id %q lacks the release or the build", HostKernel())
	}
	if m := CPUModel(); !strings.Contains(m, "flags:") || strings.HasPrefix(m, " ") {
		t.Errorf("cpu model id %q", m)
	}
}

func TestTmpKey(t *testing.T) {
	if got := tmpKey(".tmp-wk-0123456789abcdef-deadbeef"); got != "wk-0123456789abcdef" {
		t.Errorf("tmpKey: %q", got)
	}
}

func newTestCatalog(t *testing.T) *Catalog {
	t.Helper()
	p := paths.Paths{Home: t.TempDir()}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	return New(p, nil)
}

// stage writes a complete snapshot for k, as a builder would, and returns
// the staged directory and its record.
func stage(t *testing.T, c *Catalog, k Key, buildID string) (string, *Meta) {
	t.Helper()
	tmp, err := c.Stage(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tmp, "memory"), []byte("ram"), 0o600)
	return tmp, &Meta{Key: k.ID(), Parts: k, BuildID: buildID, Built: time.Now()}
}

func publish(t *testing.T, c *Catalog, k Key, buildID string) {
	t.Helper()
	tmp, m := stage(t, c, k, buildID)
	if err := c.Publish(context.Background(), tmp, m); err != nil {
		t.Fatal(err)
	}
}

func list(t *testing.T, c *Catalog) []string {
	t.Helper()
	ents, _ := os.ReadDir(c.p.Snapshots())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestPublishReplaceRetire(t *testing.T) {
	c := newTestCatalog(t)
	k := sampleKey()
	publish(t, c, k, "one")
	m, err := c.Read(k.ID())
	if err != nil || m.BuildID != "one" {
		t.Fatalf("after publish: %+v, %v", m, err)
	}
	// A rebuild replaces it; nothing else is left behind.
	publish(t, c, k, "two")
	if m, _ := c.Read(k.ID()); m == nil || m.BuildID != "two" {
		t.Fatalf("after replace: %+v", m)
	}
	if got := list(t, c); len(got) != 1 || got[0] != k.ID() {
		t.Errorf("after replace: %v", got)
	}
	// Retiring the build a run tried leaves a newer build alone.
	if ok, _ := c.Retire(k.ID(), "one"); ok {
		t.Error("retired a newer build than the one named")
	}
	if ok, _ := c.Retire(k.ID(), "two"); !ok {
		t.Error("did not retire the named build")
	}
	if got := list(t, c); len(got) != 0 {
		t.Errorf("after retire: %v", got)
	}
	if _, err := c.Read(k.ID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("read after retire: %v; want not found", err)
	}
}

func TestRetireWaitsForUsers(t *testing.T) {
	c := newTestCatalog(t)
	k := sampleKey()
	publish(t, c, k, "one")
	// A run loading the snapshot holds it.
	release, err := c.Use(context.Background(), k.ID())
	if err != nil {
		t.Fatal(err)
	}
	var retired atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		ok, _ := c.Retire(k.ID(), "")
		retired.Store(ok)
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(c.Dir(k.ID())); err != nil {
		t.Fatal("the snapshot was removed while a run was loading it")
	}
	release()
	<-done
	if !retired.Load() {
		t.Error("retire did not happen after the run finished loading")
	}
}

// TestLockWaitsEnd: a publish that waits for a snapshot's users, and a
// load that waits for a publish, end with their context, so a stuck VMM
// that holds a snapshot never holds a run past its deadline.
func TestLockWaitsEnd(t *testing.T) {
	c := newTestCatalog(t)
	k := sampleKey()
	publish(t, c, k, "one")
	release, err := c.Use(context.Background(), k.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	tmp, err := c.Stage(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.Publish(ctx, tmp, &Meta{Key: k.ID(), Parts: k})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("publish under a user: %v after %v; want the deadline, soon", err, time.Since(start))
	}
	release()
	// A publish in progress (here: its exclusive lock, taken by hand).
	lk := flock.New(c.lockPath(k.ID(), "lock"))
	if err := lk.Lock(); err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, err := c.Use(ctx2, k.ID()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("use under a publish: %v; want the deadline", err)
	}
}

func TestResolve(t *testing.T) {
	c := newTestCatalog(t)
	a := sampleKey()
	b := sampleKey()
	b.MemMiB = 256
	publish(t, c, a, "a")
	publish(t, c, b, "b")
	if got, err := c.Resolve(a.ID()[:10]); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) || (err == nil && got != a.ID()) {
		t.Errorf("Resolve(prefix of a) = %q, %v", got, err)
	}
	if got, err := c.Resolve(a.ID()); err != nil || got != a.ID() {
		t.Errorf("Resolve(full) = %q, %v", got, err)
	}
	for _, tt := range []struct {
		ref  string
		want error
	}{
		{"wk-", errdefs.ErrInvalidArgument},
		{"../etc", errdefs.ErrInvalidArgument},
		{"wk-../x", errdefs.ErrInvalidArgument},
		{"wk-ffffffffffffffff", errdefs.ErrNotFound},
	} {
		if _, err := c.Resolve(tt.ref); !errors.Is(err, tt.want) {
			t.Errorf("Resolve(%q): %v; want %v", tt.ref, err, tt.want)
		}
	}
	// A shared prefix is ambiguous.
	common := ""
	for i := range a.ID() {
		if a.ID()[i] != b.ID()[i] {
			common = a.ID()[:i]
			break
		}
	}
	if len(common) > len(KeyPrefix) {
		if _, err := c.Resolve(common); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ambiguous prefix %q: %v", common, err)
		}
	}
}

func TestGC(t *testing.T) {
	c := newTestCatalog(t)
	k := sampleKey()
	// A dead snapshot, a builder's leftover, a replaced snapshot, and a live
	// builder's temporary directory.
	publish(t, c, k, "one")
	leftover, _ := stage(t, c, k, "two")
	os.Mkdir(filepath.Join(c.p.Snapshots(), oldPrefix+k.ID()+"-00000000"), 0o700)
	live := sampleKey()
	live.MemMiB = 256
	liveTmp, _ := stage(t, c, live, "three")
	lk := flock.New(c.lockPath(live.ID(), "build"))
	if err := lk.Lock(); err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock()

	removed := c.GC(func(*Meta) string { return "dead for the test" })
	if got := list(t, c); len(got) != 1 || got[0] != filepath.Base(liveTmp) {
		t.Errorf("after gc: %v (removed %v); want only the live builder's %s", got, removed, filepath.Base(liveTmp))
	}
	if len(removed) != 3 || !strings.Contains(strings.Join(removed, " "), filepath.Base(leftover)) {
		t.Errorf("removed %v", removed)
	}
	// A snapshot the caller says may be used again stays.
	publish(t, c, k, "four")
	if removed := c.GC(func(*Meta) string { return "" }); len(removed) != 0 {
		t.Errorf("gc removed a usable snapshot: %v", removed)
	}
}

// TestEnforceEvictsLeastRecentlyUsed: over its disk budget, the catalog
// retires the snapshots used longest ago first, never the one named to
// keep, and counts uses.
func TestEnforceEvictsLeastRecentlyUsed(t *testing.T) {
	c := newTestCatalog(t)
	var keys []Key
	for i := 0; i < 3; i++ {
		k := sampleKey()
		k.MemMiB = 128 * (i + 1)
		tmp, m := stage(t, c, k, "b")
		os.WriteFile(filepath.Join(tmp, "memory"), make([]byte, 1<<20), 0o600)
		if err := c.Publish(context.Background(), tmp, m); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	// Use them oldest-first, with distinct times: 0 is the least recent.
	for i, k := range keys {
		c.Used(k.ID())
		at := time.Now().Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(filepath.Join(c.Dir(k.ID()), usesFile), at, at)
	}
	c.Used(keys[2].ID())
	if u := c.Usage(keys[2].ID(), nil); u.Uses != 2 || u.Bytes < 1<<20 {
		t.Errorf("usage %+v; want 2 uses and the memory file's size", u)
	}
	one := c.Usage(keys[0].ID(), nil).Bytes
	retired := c.Enforce(2*one+one/2, keys[0].ID())
	if len(retired) != 1 || retired[0] != keys[1].ID() {
		t.Errorf("retired %v; want only %s (the least recently used but for the kept one)", retired, keys[1].ID())
	}
	if got := c.Enforce(0, ""); got != nil {
		t.Errorf("no budget retired %v", got)
	}
}
