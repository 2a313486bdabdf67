package runs

import (
	"isopod/integration/e2e"
	"isopod/internal/knobs"

	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunEchoAndExitCodes(t *testing.T) {
	e2e.RequireVM(t)
	// A cold boot, as every run is with the warm pool off.
	r := e2e.Isopod(t, []string{knobs.WarmPool + "=off"}, "run", "--no-network", "--", "sh", "-c", "pwd; echo hello from the guest")
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run failed:\n%s", r)
	}
	if got := e2e.Str(r.JSON, "stdout"); got != "/root\nhello from the guest\n" {
		t.Errorf("stdout: got %q; want the default cwd /root, then the greeting", got)
	}
	// The documented defaults, as booted.
	if e2e.Str(r.JSON, "rootfs_flavor") != "base-min" || e2e.Num(t, r.JSON, "vcpus") != 1 ||
		e2e.Num(t, r.JSON, "mem_mib") != 512 || e2e.Num(t, r.JSON, "scratch_mib") != 1024 {
		t.Errorf("defaults: base %s, %d vCPU, %d MiB, scratch %d MiB; want base-min, 1, 512, 1024",
			e2e.Str(r.JSON, "rootfs_flavor"), e2e.Num(t, r.JSON, "vcpus"), e2e.Num(t, r.JSON, "mem_mib"), e2e.Num(t, r.JSON, "scratch_mib"))
	}
	for _, key := range []string{"vm_id", "name", "accel", "rootfs_flavor", "base_sha256", "serial_log_path", "stdout_log_path", "stderr_log_path"} {
		if e2e.Str(r.JSON, key) == "" {
			t.Errorf("report lacks %s: %s", key, r.Stdout)
		}
	}
	if e2e.Str(r.JSON, "path") != "cold" {
		t.Errorf("path: got %q; want cold", e2e.Str(r.JSON, "path"))
	}
	if vmm, _ := r.JSON["vmm"].(map[string]any); vmm["name"] != "qemu" || vmm["version"] == "" || vmm["path"] == "" {
		t.Errorf("vmm: got %v", r.JSON["vmm"])
	}
	for _, key := range []string{"boot_ms", "exec_ms", "teardown_ms", "total_ms"} {
		e2e.Num(t, r.JSON, key)
	}
	if total, parts := e2e.Num(t, r.JSON, "total_ms"), e2e.Num(t, r.JSON, "boot_ms")+e2e.Num(t, r.JSON, "exec_ms"); total < parts {
		t.Errorf("total_ms %d < boot_ms + exec_ms %d: it must include everything", total, parts)
	}
	// The record names the VMM by pid and start time, for vm gc.
	var rec struct {
		VMMPID       int    `json:"vmm_pid"`
		VMMStartTime uint64 `json:"vmm_start_time"`
	}
	b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "vms", e2e.Str(r.JSON, "vm_id"), "record.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.VMMPID <= 0 || rec.VMMStartTime == 0 {
		t.Errorf("record %s (%v): want the VMM's pid and start time", b, err)
	}
	for _, code := range []int64{0, 1, 42} {
		r := e2e.Run(t, "--no-network", "--", "sh", "-c", "echo to-stderr >&2; exit "+e2e.Itoa(code))
		if got := e2e.Num(t, r.JSON, "exit_code"); got != code {
			t.Errorf("exit_code: got %d; want %d", got, code)
		}
		if got := e2e.Str(r.JSON, "stderr"); got != "to-stderr\n" {
			t.Errorf("stderr: got %q", got)
		}
		if r.Code != 0 {
			t.Errorf("a guest's exit %d made isopod exit %d", code, r.Code)
		}
	}
}

func TestRunLargeOutput(t *testing.T) {
	e2e.RequireVM(t)
	// 200000 bytes: more than the 64 KiB inline head.
	r := e2e.Run(t, "--no-network", "--", "sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x")
	if got := e2e.Num(t, r.JSON, "stdout_bytes"); got != 200000 {
		t.Errorf("stdout_bytes: got %d; want 200000", got)
	}
	if r.JSON["stdout_truncated"] != true || len(e2e.Str(r.JSON, "stdout")) != 64<<10 {
		t.Errorf("inline head: truncated=%v len=%d", r.JSON["stdout_truncated"], len(e2e.Str(r.JSON, "stdout")))
	}
	log, err := os.ReadFile(e2e.Str(r.JSON, "stdout_log_path"))
	if err != nil || len(log) != 200000 || bytes.Count(log, []byte("x")) != 200000 {
		t.Errorf("stdout log: %d bytes, err %v", len(log), err)
	}
}

func TestRunTimeout(t *testing.T) {
	e2e.RequireVM(t)
	dest := filepath.Join(t.TempDir(), "hostname")
	start := time.Now()
	r := e2e.Run(t, "--no-network", "--timeout-s", "10", "--copy-out", "/etc/hostname:"+dest, "--", "sleep", "1000")
	took := time.Since(start)
	if r.JSON["timed_out"] != true || r.JSON["exit_code"] != nil {
		t.Errorf("timed_out=%v exit_code=%v", r.JSON["timed_out"], r.JSON["exit_code"])
	}
	if _, err := os.Lstat(dest); !os.IsNotExist(err) {
		t.Errorf("a timed-out run copied out %s (%v)", dest, err)
	}
	if took > 16*time.Second {
		t.Errorf("a 10 s timeout took %v", took)
	}
	if pids := e2e.QEMUPIDs(t, e2e.Str(r.JSON, "vm_id")); len(pids) > 0 {
		t.Errorf("QEMU still running: %v", pids)
	}
}

func TestRunMissingProgram(t *testing.T) {
	e2e.RequireVM(t)
	r := e2e.Run(t, "--no-network", "--", "no-such-program-here")
	if got := e2e.Num(t, r.JSON, "exit_code"); got != 127 {
		t.Errorf("exit_code: got %d; want 127", got)
	}
	if !strings.Contains(e2e.Str(r.JSON, "stderr"), "no-such-program-here") {
		t.Errorf("stderr does not name the program: %q", e2e.Str(r.JSON, "stderr"))
	}
	r = e2e.Run(t, "--no-network", "--cwd", "/no/such/dir", "--", "true")
	if got := e2e.Num(t, r.JSON, "exit_code"); got != 127 {
		t.Errorf("missing cwd: exit_code %d; want 127", got)
	}
}

func TestRunStdinFile(t *testing.T) {
	e2e.RequireVM(t)
	data := make([]byte, 1<<20)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(path, data, 0o600)
	sum := sha256.Sum256(data)
	r := e2e.Run(t, "--no-network", "--stdin-file", path, "--", "sha256sum")
	if got := e2e.Str(r.JSON, "stdout"); !strings.HasPrefix(got, hex.EncodeToString(sum[:])) {
		t.Errorf("guest sha256 %q; host %x", got, sum)
	}
	// "-" is isopod's own stdin.
	r = e2e.RunStdin(t, data, "--no-network", "--stdin-file", "-", "--", "sha256sum")
	if got := e2e.Str(r.JSON, "stdout"); !strings.HasPrefix(got, hex.EncodeToString(sum[:])) {
		t.Errorf("--stdin-file -: guest sha256 %q; host %x", got, sum)
	}
}

func TestRunCopyOut(t *testing.T) {
	e2e.RequireVM(t)
	dir := t.TempDir()
	dest := filepath.Join(dir, "out.bin")
	r := e2e.Run(t, "--no-network", "--copy-out", "/root/out.bin:"+dest, "--",
		"sh", "-c", "head -c 5242880 /dev/urandom > /root/out.bin && chmod 7777 /root/out.bin && sha256sum /root/out.bin")
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(got)
	if len(got) != 5<<20 || !strings.HasPrefix(e2e.Str(r.JSON, "stdout"), hex.EncodeToString(sum[:])) {
		t.Errorf("copied %d bytes, sha %x; guest said %q", len(got), sum, e2e.Str(r.JSON, "stdout"))
	}
	st, _ := os.Stat(dest)
	if st.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 || st.Mode().Perm()&0o022 != 0 {
		t.Errorf("mode not masked: %v", st.Mode())
	}
	copied, _ := r.JSON["copied"].([]any)
	if len(copied) != 1 {
		t.Errorf("copied: %v", r.JSON["copied"])
	}
	e2e.Num(t, r.JSON, "copy_out_ms")

	// Onto a symlink: refused, the link's target untouched.
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep me"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	e2e.RunFail(t, nil, "symlink", "run", "--no-network", "--copy-out", "/etc/passwd:"+link, "--", "true")
	if b, _ := os.ReadFile(target); string(b) != "keep me" {
		t.Errorf("symlink target changed: %q", b)
	}

	// A guest file that is missing: the run fails, the destination is untouched.
	os.WriteFile(dest, []byte("previous"), 0o600)
	e2e.RunFail(t, nil, "/root/missing", "run", "--no-network", "--copy-out", "/root/missing:"+dest, "--", "true")
	if b, _ := os.ReadFile(dest); string(b) != "previous" {
		t.Errorf("destination changed by a failed copy: %q", b)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".part") {
			t.Errorf("staging file left behind: %s", e.Name())
		}
	}
}

func TestRunInvalidFlagsFailBeforeBoot(t *testing.T) {
	e2e.RequireVM(t)
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	os.Symlink(filepath.Join(dir, "target"), link)
	cases := []struct {
		want string
		args []string
	}{
		{"--vcpus", []string{"--vcpus", "3"}},
		{"--vcpus", []string{"--vcpus", "64"}},
		{"--mem-mib", []string{"--mem-mib", "64"}},
		{"--mem-mib", []string{"--mem-mib", "999999"}},
		{"--scratch-mib", []string{"--scratch-mib", "100"}},
		{"--timeout-s", []string{"--timeout-s", "0"}},
		{"--timeout-s", []string{"--timeout-s", "3601"}},
		{"--env", []string{"--env", "NOEQUALS"}},
		{"--cwd", []string{"--cwd", "relative"}},
		{"--copy-out", []string{"--copy-out", "nocolon"}},
		{"--base", []string{"--base", "no-such-base"}},
		{"--stage", []string{"--stage", "no-such-stage"}},
		{"--deny-egress", []string{"--deny-egress", "--allow-host", "example.org"}},
		{"--no-network", []string{"--no-network", "--allow-host", "example.org"}},
		{"--allow-host", []string{"--allow-host", "*.org"}},
		{"--commit-as", []string{"--commit-as", "a b"}},
		{"symlink", []string{"--copy-out", "/etc/passwd:" + link}},
		{"does not exist", []string{"--copy-out", "/etc/passwd:" + filepath.Join(dir, "missing", "x")}},
	}
	before := vmCount(t)
	for _, c := range cases {
		start := time.Now()
		e2e.RunFail(t, nil, c.want, append(append([]string{"run"}, c.args...), "--", "true")...)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%v: refusal took %v; it must come before any VM starts", c.args, d)
		}
	}
	if after := vmCount(t); after != before {
		t.Errorf("invalid runs created %d VM records", after-before)
	}
}

func vmCount(t *testing.T) int {
	ents, _ := os.ReadDir(filepath.Join(e2e.HomeDir, "vms"))
	return len(ents)
}

func TestRunParallel(t *testing.T) {
	e2e.RequireVM(t)
	results := e2e.Parallel(2, func(i int) *e2e.Result {
		return e2e.Isopod(t, nil, "run", "--no-network", "--", "sh", "-c", "echo run-"+e2e.Itoa(int64(i)))
	})
	for i, r := range results {
		if r.Code != 0 || e2e.Str(r.JSON, "stdout") != "run-"+e2e.Itoa(int64(i))+"\n" {
			t.Errorf("parallel run %d:\n%s", i, r)
		}
	}
}

func TestSIGTERMLeavesNoQEMU(t *testing.T) { testSignalLeavesNoQEMU(t, syscall.SIGTERM) }

func TestSIGINTLeavesNoQEMU(t *testing.T) { testSignalLeavesNoQEMU(t, syscall.SIGINT) }

func TestSIGKILLLeavesNoQEMU(t *testing.T) { testSignalLeavesNoQEMU(t, syscall.SIGKILL) }

func testSignalLeavesNoQEMU(t *testing.T, sig syscall.Signal) {
	e2e.RequireVM(t)
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod"), "run", "--no-network", "--", "sleep", "1000")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Wait until its QEMU runs.
	var vm string
	deadline := time.Now().Add(30 * time.Second)
	for vm == "" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		vm = e2e.VMOfOwner(cmd.Process.Pid)
	}
	if vm == "" {
		t.Fatal("no VM appeared for the run")
	}
	for len(e2e.QEMUPIDs(t, vm)) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	cmd.Process.Signal(sig)
	cmd.Wait()
	deadline = time.Now().Add(5 * time.Second)
	for len(e2e.QEMUPIDs(t, vm)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if pids := e2e.QEMUPIDs(t, vm); len(pids) > 0 {
		t.Fatalf("QEMU %v outlived isopod", pids)
	}
	if sig != syscall.SIGKILL && !bytes.Contains(out.Bytes(), []byte(`"ok":false`)) {
		t.Errorf("an interrupted run should report failure, got %s", out.Bytes())
	}
	if sig == syscall.SIGKILL {
		// What a killed isopod could not remove, vm gc does: its VMM's
		// cgroup among it.
		t.Logf("cgroups left by the killed run: %v", e2e.VMCgroups(vm))
		if r := e2e.Isopod(t, nil, "vm", "gc"); r.Code != 0 {
			t.Fatalf("vm gc: %s", r)
		}
	}
	if left := e2e.VMCgroups(vm); len(left) > 0 {
		t.Errorf("the VMM's cgroups %v outlived the run", left)
	}
}

func TestProtocolMismatchNamesRebuild(t *testing.T) {
	e2e.RequireVM(t)
	// An agent that announces another protocol version, in an initramfs of
	// its own under a state root of its own.
	home := t.TempDir()
	agent := filepath.Join(t.TempDir(), "isopod-agent")
	build := exec.Command("go", "build", "-o", agent, "-ldflags", "-X isopod/internal/agent.protoVersionOverride=999", "isopod/cmd/isopod-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	os.MkdirAll(filepath.Join(home, "images"), 0o700)
	if err := os.Symlink(filepath.Join(e2e.HomeDir, "kernels"), filepath.Join(home, "kernels")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"base-min.sqfs", "base-min.json"} {
		b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "images", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(home, "images", f), b, 0o600)
	}
	env := []string{"ISOPOD_HOME=" + home, "ISOPOD_AGENT_BIN=" + agent}
	if r := e2e.Isopod(t, env, "image", "build", "initramfs"); r.Code != 0 {
		t.Fatalf("building the initramfs:\n%s", r)
	}
	e2e.RunFail(t, env, "isopod image build-all", "run", "--no-network", "--", "true")
}

// TestGuestLoadsItsDevicesModules: a guest loads the modules of the devices
// it has: without a NIC no network driver; never vsock, which QEMU's
// machine lacks.
func TestGuestLoadsItsDevicesModules(t *testing.T) {
	e2e.RequireVM(t)
	for _, tt := range []struct {
		args []string
		want bool // virtio_net loaded
	}{{[]string{"--no-network"}, false}, {nil, true}} {
		r := e2e.Run(t, append(tt.args, "--", "cat", "/proc/modules")...)
		mods := e2e.Str(r.JSON, "stdout")
		if got := strings.Contains(mods, "virtio_net "); got != tt.want {
			t.Errorf("%v: virtio_net loaded %v; want %v:\n%s", tt.args, got, tt.want, mods)
		}
		if strings.Contains(mods, "vsock") || !strings.Contains(mods, "overlay ") {
			t.Errorf("%v: want overlay and no vsock:\n%s", tt.args, mods)
		}
	}
}
