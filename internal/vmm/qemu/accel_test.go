package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

func TestSelectAccel(t *testing.T) {
	ok := func() kvmFacts { return kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o660, "kvm", 993)} }
	fail := func() kvmFacts { return kvmFacts{} }
	boots := func(context.Context) error { return nil }
	hangs := func(context.Context) error { return errors.New("no kernel banner") }
	mustNotBoot := func(context.Context) error {
		t.Error("boot probe ran")
		return nil
	}
	tests := []struct {
		name    string
		want    vmm.Accel
		env     string
		open    func() kvmFacts
		boot    func(context.Context) error
		got     vmm.Accel
		wantErr error
	}{
		{name: "auto with working kvm", open: ok, boot: boots, got: vmm.AccelKVM},
		{name: "auto without /dev/kvm", open: fail, boot: mustNotBoot, got: vmm.AccelTCG},
		{name: "auto when the guest cannot run under kvm", open: ok, boot: hangs, got: vmm.AccelTCG},
		{name: "config tcg", want: vmm.AccelTCG, open: ok, boot: mustNotBoot, got: vmm.AccelTCG},
		{name: "config kvm skips the probe", want: vmm.AccelKVM, open: ok, boot: mustNotBoot, got: vmm.AccelKVM},
		{name: "config kvm without /dev/kvm", want: vmm.AccelKVM, open: fail, boot: mustNotBoot, wantErr: errdefs.ErrNotSupported},
		{name: "env tcg beats config kvm", want: vmm.AccelKVM, env: "tcg", open: ok, boot: mustNotBoot, got: vmm.AccelTCG},
		{name: "env kvm beats auto", env: "kvm", open: ok, boot: mustNotBoot, got: vmm.AccelKVM},
		{name: "env kvm without /dev/kvm", env: "kvm", open: fail, boot: mustNotBoot, wantErr: errdefs.ErrNotSupported},
		{name: "env garbage", env: "hvf", open: ok, boot: mustNotBoot, wantErr: errdefs.ErrInvalidArgument},
		{name: "config garbage", want: "xen", open: ok, boot: mustNotBoot, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := selectAccel(context.Background(), tt.want, accelProbes{
				env:     func() string { return tt.env },
				facts:   tt.open,
				bootKVM: tt.boot,
			})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v, %v; want error %v", c, err, tt.wantErr)
				}
				return
			}
			if err != nil || c.Accel != tt.got {
				t.Fatalf("got %+v, %v; want %s", c, err, tt.got)
			}
			assertSentence(t, c.Reason)
		})
	}
}

func TestSelectAccelCancelledProbe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := selectAccel(ctx, vmm.AccelAuto, accelProbes{
		env:     func() string { return "" },
		facts:   func() kvmFacts { return kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o666, "kvm", 993)} },
		bootKVM: func(ctx context.Context) error { return ctx.Err() },
	})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("got %v; want ErrUnavailable (a cancelled probe must not pick TCG)", err)
	}
}

func TestCPUInfoKHz(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
	}{
		{"processor\t: 0\ncpu MHz\t\t: 2100.000\ncache size\t: 1 KB\n", 2100000},
		{"cpu MHz : 2893.204\ncpu MHz : 1.0\n", 2893204},
		{"processor : 0\n", 0},
		{"cpu MHz : fast\n", 0},
	}
	for _, tt := range tests {
		if got := cpuinfoKHz([]byte(tt.in)); got != tt.want {
			t.Errorf("cpuinfoKHz(%q) = %d; want %d", tt.in, got, tt.want)
		}
	}
}

func TestParseVersion(t *testing.T) {
	out := "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022\n"
	if v, err := parseVersion(out); err != nil || v != "7.2.22" {
		t.Errorf("parseVersion = %q, %v; want 7.2.22", v, err)
	}
	if _, err := parseVersion("something else\n"); err == nil {
		t.Error("parseVersion accepted output without a version")
	}
}

func TestMarkerWriter(t *testing.T) {
	w := &markerWriter{marker: []byte("Linux version"), seen: make(chan struct{})}
	// The marker split across writes, after plenty of noise.
	for _, s := range []string{"Probing EDD... ok\r\n", "[ 0.000] Linux ve", "rsion 6.1"} {
		if w.found() {
			t.Fatalf("marker seen before %q", s)
		}
		w.Write([]byte(s))
	}
	select {
	case <-w.seen:
	default:
		t.Fatal("marker split across writes not seen")
	}
	w.Write([]byte("Linux version again")) // must not close twice
}

// TestProbeCache checks that a remembered outcome is used without booting:
// the kernel here is garbage, so a real probe could never succeed.
func TestProbeCache(t *testing.T) {
	dir := t.TempDir()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("garbage"), 0o644)
	cache := filepath.Join(dir, "probe.json")
	d := &Driver{bin: bin, probeCache: cache, probed: map[string]error{}, log: slog.New(slog.DiscardHandler)}
	key, err := d.probeKey(kernel)
	if err != nil {
		t.Fatal(err)
	}
	write := func(rec probeRecord) {
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(cache, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write(probeRecord{Key: key, KVM: true, At: time.Now()})
	if err := d.kvmBoots(context.Background(), kernel); err != nil {
		t.Errorf("cached success: got %v", err)
	}

	// A fresh driver believes a recent failure.
	d = &Driver{bin: bin, probeCache: cache, probed: map[string]error{}, log: slog.New(slog.DiscardHandler)}
	write(probeRecord{Key: key, KVM: false, Reason: "no kernel banner", At: time.Now()})
	if err := d.kvmBoots(context.Background(), kernel); err == nil || err.Error() != "no kernel banner" {
		t.Errorf("cached failure: got %v", err)
	}

	// Another kernel (different key) is not answered from the cache.
	if r, ok := d.readProbeCache("other"); ok {
		t.Errorf("cache answered for another key: %+v", r)
	}
	// An old failure expires.
	write(probeRecord{Key: key, KVM: false, Reason: "x", At: time.Now().Add(-2 * probeNegativeTTL)})
	if r, ok := d.readProbeCache(key); ok {
		t.Errorf("expired failure still used: %+v", r)
	}
}
