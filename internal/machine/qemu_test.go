package machine_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/internal/image"
	"isopod/internal/knobs"
	"isopod/internal/machine"
	"isopod/internal/paths"
	"isopod/internal/vmm"
	"isopod/internal/vmm/qemu"
)

// installedGuest is the kernel, initramfs and base-min image under the
// state root ($ISOPOD_HOME, else ~/.isopod), with a fresh scratch disk in
// dir; the test is skipped when they are not installed.
func installedGuest(t *testing.T, dir string) (kernel, initrd string, disks machine.Disks) {
	t.Helper()
	home := os.Getenv(knobs.Home)
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			t.Skip(err)
		}
		home = filepath.Join(h, ".isopod")
	}
	p := paths.Paths{Home: home}
	kernels, _ := filepath.Glob(filepath.Join(p.Kernels(), "*", "vmlinuz"))
	initrd = filepath.Join(p.Images(), "initramfs.cpio")
	base := filepath.Join(p.Images(), "base-min.sqfs")
	for _, f := range []string{initrd, base} {
		if _, err := os.Stat(f); err != nil || len(kernels) == 0 {
			t.Skipf("no installed guest under %s (scripts/install.sh): %v", home, err)
		}
	}
	initrd = guestInitramfs(t, p, initrd, dir)
	tmpl, err := image.ScratchTemplate(p, 1024)
	if err != nil {
		t.Skipf("no scratch template: %v", err)
	}
	scratch := filepath.Join(dir, "scratch.ext4")
	if err := image.CopySparse(scratch, tmpl); err != nil {
		t.Fatal(err)
	}
	return kernels[len(kernels)-1], initrd, machine.Disks{Base: base, Scratch: scratch}
}

// guestInitramfs is the installed initramfs when it holds the agent built
// from this tree, else one made with that agent in dir: the installed one
// may speak another protocol.
func guestInitramfs(t *testing.T, p paths.Paths, installed, dir string) string {
	t.Helper()
	agent := filepath.Join(dir, "isopod-agent")
	build := exec.Command("go", "build", "-o", agent, "isopod/cmd/isopod-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	var side struct {
		AgentSHA256 string `json:"agent_sha256"`
	}
	if b, err := os.ReadFile(strings.TrimSuffix(installed, ".cpio") + ".json"); err == nil {
		json.Unmarshal(b, &side)
	}
	if side.AgentSHA256 == fmt.Sprintf("%x", sha256.Sum256(bin)) {
		return installed
	}
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(p.Kernels(), filepath.Join(home, "kernels")); err != nil {
		t.Fatal(err)
	}
	info, err := image.BuildInitramfs(context.Background(), paths.Paths{Home: home}, image.BuildOptions{AgentBin: agent})
	if err != nil {
		t.Fatalf("building an initramfs with this tree's agent: %v", err)
	}
	return info.Path
}

// TestQEMUExecManyTimes boots one real VM, runs three commands in it, each
// with its own environment, timeout and result, and halts it: no QEMU is
// left.
func TestQEMUExecManyTimes(t *testing.T) {
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
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := vmm.Config{ID: "vm-0000000b", Dir: dir, Kernel: kernel, Initrd: initrd, Cmdline: machine.Cmdline("many"),
		VCPUs: 1, MemMiB: 256, Disks: disks.Cold()}
	if err := m.Boot(ctx, drv, cfg); err != nil {
		t.Fatalf("Boot: %v", err)
	}
	vm, _ := m.Current()
	pid := vm.Pid()
	if err := m.Mount(ctx, disks, "", false, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if _, err := m.Configure(ctx); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	path := "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
	runExecs(t, ctx, m, []execCase{
		{"env", machine.Exec{Argv: []string{"/bin/sh", "-c", `echo "$GREETING $(hostname)"`}, Env: []string{path, "GREETING=hello"},
			Cwd: "/", Timeout: time.Minute}, 0, false, "hello many\n", ""},
		{"timeout", machine.Exec{Argv: []string{"/bin/sh", "-c", "echo started; sleep 60"}, Env: []string{path},
			Cwd: "/tmp", Timeout: 2 * time.Second}, -1, true, "started\n", ""},
		{"exit code", machine.Exec{Argv: []string{"/bin/sh", "-c", `echo "${GREETING:-unset} $PWD" >&2; exit 7`}, Env: []string{path},
			Cwd: "/tmp", Timeout: time.Minute}, 7, false, "", "unset /tmp\n"},
	})
	if err := m.Halt(ctx, 30*time.Second); err != nil {
		t.Errorf("Halt: %v", err)
	}
	m.Close()
	if pid > 0 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("QEMU (pid %d) still runs after Halt and Close", pid)
		}
	}
}
