package machine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmm/qemu"
)

// bootQEMU boots base-min under QEMU with its root mounted and returns the
// Machine; it is closed when the test ends.
func bootQEMU(t *testing.T, hostname string) (*machine.Machine, context.Context) {
	t.Helper()
	m, ctx, _, _ := bootQEMUWith(t, hostname)
	return m, ctx
}

// bootQEMUWith is bootQEMU, also returning the driver and the VM's
// configuration (to restore a snapshot of it).
func bootQEMUWith(t *testing.T, hostname string) (*machine.Machine, context.Context, *qemu.Driver, vmm.Config) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	if _, err := exec.LookPath(qemu.DefaultBinary); err != nil {
		t.Skipf("%s not installed", qemu.DefaultBinary)
	}
	dir := t.TempDir()
	kernel, initrd, disks := installedGuest(t, dir)
	drv, err := qemu.New(qemu.Config{ProbeCache: filepath.Join(dir, "probe.json")})
	if err != nil {
		t.Fatal(err)
	}
	m := machine.New(nil)
	t.Cleanup(m.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	cfg := vmm.Config{ID: "vm-0000000c", Dir: dir, Kernel: kernel, Initrd: initrd, Cmdline: machine.Cmdline(hostname),
		VCPUs: 1, MemMiB: 256, Disks: disks.Cold()}
	if err := m.Boot(ctx, drv, cfg); err != nil {
		t.Fatalf("Boot: %v", err)
	}
	if err := m.Mount(ctx, disks, "", false, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if _, err := m.Configure(ctx); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return m, ctx, drv, cfg
}

// sh runs script in the guest and returns its stdout, failing on a
// non-zero exit.
func sh(t *testing.T, ctx context.Context, m *machine.Machine, keep bool, script string) (string, time.Duration) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := m.Exec(ctx, machine.Exec{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Cwd: "/", Timeout: time.Minute, Stdout: &out, Stderr: &errb, Keep: keep})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("%q: %+v, %v; stderr %q", script, res, err, errb.String())
	}
	return out.String(), res.Elapsed
}

// TestQEMUSession keeps one real VM across calls: a server started by a
// kept exec answers the next exec, `sleep 100 &` returns at once, a
// background job is read and waited for, a file copied in is whole, and
// the server is reached from the host through Expose.
func TestQEMUSession(t *testing.T) {
	m, ctx := bootQEMU(t, "sess")
	if err := m.Session(ctx); err != nil {
		t.Fatalf("Session: %v", err)
	}
	// busybox httpd puts itself in the background; the exec returns and
	// the server stays.
	sh(t, ctx, m, true, "mkdir -p /tmp/www && echo served > /tmp/www/index.html && httpd -p 127.0.0.1:8000 -h /tmp/www")
	if got, _ := sh(t, ctx, m, false, "wget -q -O - http://127.0.0.1:8000/"); got != "served\n" {
		t.Errorf("the kept server answered %q", got)
	}
	// The same server, from the host, over the agent channel: the VM has
	// no network.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ectx, stopExpose := context.WithCancel(ctx)
	exposed := make(chan error, 1)
	go func() { exposed <- m.Expose(ectx, 8000, ln) }()
	t0 := time.Now()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("GET through Expose: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "served\n" {
		t.Errorf("through Expose the server answered %q", body)
	}
	t.Logf("a GET through Expose took %s", time.Since(t0))
	sum, _ := sh(t, ctx, m, false, "head -c 8388608 /dev/urandom > /tmp/www/big && sha256sum /tmp/www/big")
	t0 = time.Now()
	resp, err = http.Get("http://" + ln.Addr().String() + "/big")
	if err != nil {
		t.Fatalf("GET of 8 MiB through Expose: %v", err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || fmt.Sprintf("%x", h.Sum(nil)) != strings.Fields(sum)[0] {
		t.Errorf("8 MiB through Expose: %d bytes, %v; the digest differs from the guest's", n, err)
	}
	t.Logf("8 MiB through Expose took %s", time.Since(t0))
	stopExpose()
	if err := <-exposed; err != nil {
		t.Errorf("Expose: %v", err)
	}

	pid, took := sh(t, ctx, m, true, "sleep 100 & echo $!")
	if took > 10*time.Second {
		t.Errorf("`sleep 100 &` kept the exec %s", took)
	}
	t.Logf("a kept `sleep 100 &` took %s", took)
	if got, _ := sh(t, ctx, m, false, "kill -0 "+strings.TrimSpace(pid)+" && echo running"); got != "running\n" {
		t.Errorf("the kept sleep: %q", got)
	}

	job, err := m.StartJob(ctx, machine.Exec{Argv: []string{"/bin/sh", "-c", "echo start; sleep 1; echo end; exit 5"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("StartJob: %v", err)
	}
	done, err := m.JobWait(ctx, job.ID, time.Minute, 0)
	if err != nil || done.ExitCode == nil || *done.ExitCode != 5 || string(done.Stdout) != "start\nend\n" {
		t.Errorf("JobWait: %+v %q, %v", done.JobInfo, done.Stdout, err)
	}

	data := make([]byte, 300<<10)
	rand.Read(data)
	t0 = time.Now()
	if _, err := m.PutFile(ctx, "/tmp/in/data.bin", 0o640, 1<<20, bytes.NewReader(data)); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	t.Logf("copying %d KiB in took %s", len(data)>>10, time.Since(t0))
	want := fmt.Sprintf("%x  /tmp/in/data.bin\n640\n", sha256.Sum256(data))
	if got, _ := sh(t, ctx, m, false, "sha256sum /tmp/in/data.bin; stat -c %a /tmp/in/data.bin"); got != want {
		t.Errorf("the copied-in file: %q; want %q", got, want)
	}
	if err := m.Halt(ctx, 30*time.Second); err != nil {
		t.Errorf("Halt: %v", err)
	}
}

// A session VM snapshotted and restored (a pause and resume) keeps its
// background job, which ran on, and the server a kept exec left.
func TestQEMUSessionSurvivesSnapshot(t *testing.T) {
	m, ctx, drv, cfg := bootQEMUWith(t, "pause")
	if err := m.Session(ctx); err != nil {
		t.Fatalf("Session: %v", err)
	}
	job, err := m.StartJob(ctx, machine.Exec{Argv: []string{"/bin/sh", "-c", "i=0; while :; do echo $i; i=$((i+1)); sleep 0.1; done"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("StartJob: %v", err)
	}
	sh(t, ctx, m, true, "mkdir -p /tmp/www && echo still-served > /tmp/www/index.html && httpd -p 127.0.0.1:8000 -h /tmp/www")
	before, err := m.JobWait(ctx, job.ID, 300*time.Millisecond, 0)
	if err != nil || before.State != "running" {
		t.Fatalf("JobWait before the snapshot: %+v, %v", before.JobInfo, err)
	}
	snap := t.TempDir()
	if err := m.Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	m.Drop()
	if _, err := m.Restore(ctx, drv, cfg, snap); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := m.Greet(ctx); err != nil {
		t.Fatalf("Greet after the restore: %v", err)
	}
	if err := m.Session(ctx); err != nil {
		t.Fatalf("Session after the restore: %v", err)
	}
	after, err := m.JobWait(ctx, job.ID, 500*time.Millisecond, 0)
	if err != nil || after.State != "running" || len(after.Stdout) == 0 {
		t.Errorf("the job after the restore: %+v %q, %v; want it running on", after.JobInfo, after.Stdout, err)
	}
	if got, _ := sh(t, ctx, m, false, "wget -q -O - http://127.0.0.1:8000/"); got != "still-served\n" {
		t.Errorf("the kept server after the restore: %q", got)
	}
	if err := m.JobKill(ctx, job.ID, 9); err != nil {
		t.Errorf("JobKill: %v", err)
	}
	if err := m.Halt(ctx, 30*time.Second); err != nil {
		t.Errorf("Halt: %v", err)
	}
}
