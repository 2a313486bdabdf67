package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"isopod/internal/vmm"
	"os"
	"strings"
	"sync"
	"time"
)

// probeMarker is printed by the kernel once it runs in 64-bit mode. Some
// hosts hand out a /dev/kvm on which QEMU starts but the guest never leaves
// its real-mode setup code, so "QEMU started" proves nothing.
const probeMarker = "Linux version"

// probeRecord is the on-disk form of a probe outcome.
type probeRecord struct {
	Key    string    `json:"key"`
	KVM    bool      `json:"kvm"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// probeNegativeTTL is how long a failed probe is believed: a loaded host
// can make a good KVM miss the deadline, so failures are retried hourly.
const probeNegativeTTL = time.Hour

// kvmBoots reports whether QEMU runs kernel under KVM far enough to print
// the kernel banner. The answer is remembered per kernel, in memory and in
// the probe cache file when one is configured.
func (d *Driver) kvmBoots(ctx context.Context, kernel string) error {
	key, err := d.probeKey(kernel)
	if err != nil {
		return err
	}
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	if res, ok := d.probed[key]; ok {
		return res
	}
	if rec, ok := d.readProbeCache(key); ok {
		var res error
		if !rec.KVM {
			res = errors.New(rec.Reason)
		}
		d.probed[key] = res
		return res
	}
	start := time.Now()
	res := d.probeKVM(ctx, kernel)
	if ctx.Err() != nil {
		return res // inconclusive: the caller gave up
	}
	d.log.Info("qemu kvm probe", "ok", res == nil, "took", time.Since(start).Round(time.Millisecond), "err", res)
	d.probed[key] = res
	rec := probeRecord{Key: key, KVM: res == nil, At: time.Now()}
	if res != nil {
		rec.Reason = res.Error()
	}
	d.writeProbeCache(rec)
	return res
}

// probeKey names what the outcome depends on: the QEMU binary, the kernel
// and this boot of the host.
func (d *Driver) probeKey(kernel string) (string, error) {
	var parts []string
	for _, f := range []string{d.bin, kernel} {
		st, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("qemu: kvm probe: %w", err)
		}
		parts = append(parts, fmt.Sprintf("%s:%d:%d", f, st.Size(), st.ModTime().UnixNano()))
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	parts = append(parts, strings.TrimSpace(string(boot)))
	return strings.Join(parts, "|"), nil
}

func (d *Driver) readProbeCache(key string) (probeRecord, bool) {
	var rec probeRecord
	if !readCache(d.probeCache, &rec) || rec.Key != key {
		return probeRecord{}, false
	}
	if !rec.KVM && time.Since(rec.At) > probeNegativeTTL {
		return probeRecord{}, false
	}
	return rec, true
}

// writeProbeCache publishes rec; failures only cost a re-probe.
func (d *Driver) writeProbeCache(rec probeRecord) { writeCache(d.probeCache, rec) }

// probeKVM boots kernel under KVM without an initrd and waits for the
// kernel banner on the console, then kills QEMU.
func (d *Driver) probeKVM(ctx context.Context, kernel string) error {
	ctx, cancel := context.WithTimeout(ctx, d.probeTimeout)
	defer cancel()
	plan, err := d.machine(ctx)
	if err != nil {
		return err
	}
	k, err := d.bootFile(kernel)
	if err != nil {
		return err
	}
	defer k.Close()
	args := []string{
		"-name", "isopod-kvmprobe",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
	}
	for _, dir := range plan.DataDirs {
		args = append(args, "-L", dir)
	}
	args = append(args,
		"-machine", plan.Options,
		"-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "128M",
		"-kernel", fdPath(fdQMP-1), // the kernel is the first inherited file
		"-append", "console=ttyS0 earlyprintk=serial,ttyS0 loglevel=7 panic=-1",
		"-chardev", "stdio,id=con0,signal=off",
		"-serial", "chardev:con0",
	)
	w := &markerWriter{marker: []byte(probeMarker), seen: make(chan struct{})}
	ps := procSpec{bin: d.bin, args: args, extra: []*os.File{k}, stdout: w}
	if d.jail != nil {
		ps.jail, ps.js = d.jail, d.jailSpec(&vmm.Config{ID: "kvmprobe", MemMiB: 128}, vmm.AccelKVM, nil)
	}
	p, err := startProc(ps)
	if err != nil {
		return err
	}
	defer func() {
		p.kill()
		p.wait()
	}()
	select {
	case <-w.seen:
		return nil
	case <-p.done:
		if w.found() {
			return nil
		}
		if err := p.wait(); err != nil {
			return err
		}
		return errors.New("qemu exited before the kernel banner")
	case <-ctx.Done():
		return fmt.Errorf("no kernel banner within %v", d.probeTimeout)
	}
}

// markerWriter closes seen once marker has been written to it.
type markerWriter struct {
	marker []byte
	seen   chan struct{}

	mu   sync.Mutex
	tail []byte
	hit  bool
}

func (w *markerWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hit {
		return len(b), nil
	}
	w.tail = append(w.tail, b...)
	if bytes.Contains(w.tail, w.marker) {
		w.hit = true
		close(w.seen)
		w.tail = nil
		return len(b), nil
	}
	if keep := len(w.marker) - 1; len(w.tail) > keep {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-keep:]...)
	}
	return len(b), nil
}

func (w *markerWriter) found() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hit
}
