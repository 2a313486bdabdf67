package agent

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
)

// kernelEnv names a kernel directory (vmlinuz, modules/, modules.order as
// isopod keeps them under $ISOPOD_HOME/kernels/<version>) for TestBootInVM.
const kernelEnv = "ISOPOD_AGENT_TEST_KERNEL"

// TestBootInVM boots the agent as PID 1 under QEMU with a tiny base (a
// static busybox) and a scratch disk, then runs commands, copies a file
// out and halts. It costs a TCG boot, so it runs only when asked for.
func TestBootInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; skipped in -short")
	}
	kdir := os.Getenv(kernelEnv)
	if kdir == "" {
		t.Skipf("set %s to a kernel directory (e.g. ~/.isopod/kernels/<version>) to boot the agent in QEMU", kernelEnv)
	}
	for _, tool := range []string{"qemu-system-x86_64", "mksquashfs", "mkfs.ext4", "cpio", "busybox", "dumpe2fs", "debugfs", "mknod"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	agentBin := filepath.Join(dir, "isopod-agent")
	build := exec.Command("go", "build", "-o", agentBin, "isopod/cmd/isopod-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}

	// initramfs: /init, the modules and their list.
	ird := filepath.Join(dir, "initrd")
	os.MkdirAll(filepath.Join(ird, "etc/isopod"), 0o755)
	run("cp", agentBin, filepath.Join(ird, "init"))
	order, err := os.ReadFile(filepath.Join(kdir, "modules.order"))
	if err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, m := range strings.Fields(string(order)) {
		dst := filepath.Join(ird, "lib/modules", m)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		run("cp", filepath.Join(kdir, "modules", m), dst)
		list = append(list, "/lib/modules/"+m)
	}
	os.WriteFile(filepath.Join(ird, "etc/isopod/modules"), []byte(strings.Join(list, "\n")+"\n"), 0o644)
	initrd := filepath.Join(dir, "initrd.cpio")
	c := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet > "+initrd)
	c.Dir = ird
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}

	// base: busybox and a file to copy out.
	based := filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(based, "bin"), 0o755)
	os.MkdirAll(filepath.Join(based, "etc"), 0o755)
	run("cp", "/usr/bin/busybox", filepath.Join(based, "bin/busybox"))
	for _, a := range []string{"sh", "echo", "cat", "sleep", "hostname", "ls", "mount"} {
		os.Symlink("busybox", filepath.Join(based, "bin", a))
	}
	os.WriteFile(filepath.Join(based, "etc/hello.txt"), []byte("hello from the base\n"), 0o640)
	base := filepath.Join(dir, "base.sqfs")
	run("mksquashfs", based, base, "-noappend", "-quiet", "-comp", "gzip")
	// One stage layer: a file added and a base file deleted (a whiteout).
	layerd := filepath.Join(dir, "layer0")
	os.MkdirAll(filepath.Join(layerd, "upper/etc"), 0o755)
	os.MkdirAll(filepath.Join(layerd, "upper/bin"), 0o755)
	os.WriteFile(filepath.Join(layerd, "upper/etc/layer.txt"), []byte("from layer 0\n"), 0o644)
	run("mknod", filepath.Join(layerd, "upper/bin/ls"), "c", "0", "0")
	layer := filepath.Join(dir, "layer0.ext4")
	run("truncate", "-s", "16M", layer)
	run("mkfs.ext4", "-q", "-F", "-d", layerd, layer)
	scratch := filepath.Join(dir, "scratch.ext4")
	run("truncate", "-s", "64M", scratch)
	run("mkfs.ext4", "-q", "-F", scratch)

	sock := filepath.Join(dir, "agent.sock")
	consoleLog := filepath.Join(dir, "console.log")
	qemu := exec.Command("qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-m", "512", "-smp", "1",
		"-nodefaults", "-no-reboot", "-display", "none", "-serial", "file:"+consoleLog,
		"-kernel", filepath.Join(kdir, "vmlinuz"), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 isopod.layers=1 isopod.hostname=smoke",
		"-drive", "file="+base+",if=none,id=base,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=base,serial=isopod-base",
		"-drive", "file="+layer+",if=none,id=layer0,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=layer0,serial="+LayerSerial(0),
		"-drive", "file="+scratch+",if=none,id=scratch,format=raw",
		"-device", "virtio-blk-pci,drive=scratch,serial=isopod-scratch",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path="+sock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+PortName)
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { qemu.Wait(); close(exited) }()
	t.Cleanup(func() {
		qemu.Process.Kill()
		<-exited
		if t.Failed() || testing.Verbose() {
			b, _ := os.ReadFile(consoleLog)
			t.Logf("console:\n%s", b)
		}
	})
	var conn net.Conn
	for i := 0; i < 100 && conn == nil; i++ {
		conn, _ = net.Dial("unix", sock)
		time.Sleep(50 * time.Millisecond)
	}
	if conn == nil {
		t.Fatal("could not connect to the agent socket")
	}
	defer conn.Close()
	cl := agentclient.New(conn, nil)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bootStart := time.Now()
	h, err := cl.WaitHello(ctx)
	if err != nil {
		t.Fatalf("WaitHello: %v", err)
	}
	t.Logf("hello after %s: %+v", time.Since(bootStart), h)
	if h.BootError != "" || h.Kernel == "" {
		t.Fatalf("hello %+v; want no boot error", h)
	}
	guestExec := func(argv ...string) (stdout, stderr string, code int) {
		t.Helper()
		var o, e bytes.Buffer
		done, err := cl.Exec(ctx, agentclient.ExecRequest{Exec: agentproto.Exec{Argv: argv, TimeoutMS: 5000}, Stdout: &o, Stderr: &e})
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		code = -1
		if done.ExitCode != nil {
			code = *done.ExitCode
		}
		return o.String(), e.String(), code
	}

	if out, errs, code := guestExec("sh", "-c", "hostname; pwd; echo kept > /root/kept; cat /proc/self/mountinfo | grep -c ' / / '"); code != 0 || !strings.HasPrefix(out, "smoke\n/root\n") {
		t.Errorf("exec: code %d stdout %q stderr %q", code, out, errs)
	}
	if out, errs, code := guestExec("sh", "-c", "cat /etc/layer.txt; test -e /bin/ls || echo ls-deleted"); out != "from layer 0\nls-deleted\n" {
		t.Errorf("layer contents: code %d stdout %q stderr %q", code, out, errs)
	}
	if _, errs, code := guestExec("nosuchprog"); code != 127 || !strings.Contains(errs, "command not found") {
		t.Errorf("missing program: code %d stderr %q", code, errs)
	}
	// Orphans of an exec are reaped by PID 1.
	if _, errs, code := guestExec("sh", "-c", "sleep 100 & echo bg"); code != 0 {
		t.Errorf("background exec: code %d stderr %q", code, errs)
	}
	var got memFile
	if fd, err := cl.CopyOut(ctx, "/etc/hello.txt", agentclient.CopyLimits{MaxData: agentclient.NoLimit}, &got); err != nil ||
		string(got.b) != "hello from the base\n" || fd.Mode != 0o640 {
		t.Errorf("copy out: %+v, %v, data %q", fd, err, got.b)
	}
	for _, call := range []struct {
		msg     *agentproto.Msg
		payload []byte
	}{
		{&agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: time.Now().UnixNano()}}, nil},
		{&agentproto.Msg{Kind: agentproto.KindAddEntropy}, make([]byte, 64)},
		{&agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil},
	} {
		if err := cl.Call(ctx, call.msg, call.payload); err != nil {
			t.Errorf("%s: %v", call.msg.Kind, err)
		}
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the VM did not power off after halt")
	}
	out, _ := exec.Command("dumpe2fs", "-h", scratch).CombinedOutput()
	if !strings.Contains(string(out), "Filesystem state:         clean") || strings.Contains(string(out), "needs_recovery") {
		t.Errorf("scratch is not clean after halt:\n%s", out)
	}
	out, _ = exec.Command("debugfs", "-R", "cat /upper/root/kept", scratch).Output()
	if string(out) != "kept\n" {
		t.Errorf("/root/kept in the scratch upper: %q", out)
	}
}
