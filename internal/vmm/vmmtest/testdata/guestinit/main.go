// Command guestinit is the /init of the tiny initramfs that vmmtest builds
// for driver tests. As PID 1 it mounts the kernel filesystems, loads the
// kernel modules listed in /etc/modules, opens the virtio-serial port named
// isopod.agent and serves the agent protocol on it with isopod's own agent
// code (no System: machine operations are refused). A Halt powers the
// machine off; when the host closes the channel it says so on the console
// and opens the port again.
//
// Run as any other process (an exec of the host's), it is a tool for the
// suite's checks:
//
//	/init disks              "vdX serial" per disk, one a line
//	/init write SERIAL TEXT  writes TEXT at offset 0 of that disk and fsyncs
//
// Anything PID 1 cannot do it reports on the console and powers off.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agent"
)

func main() {
	if os.Getpid() != 1 {
		os.Exit(tool(os.Args[1:]))
	}
	dev, err := boot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "guestinit: %v\n", err)
		poweroff()
	}
	serve(dev)
}

func boot() (string, error) {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && err != syscall.EBUSY {
			return "", fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// The initramfs has no /dev/console node; take the console now.
	if c, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := 0; fd < 3; fd++ {
			unix.Dup3(int(c.Fd()), fd, 0)
		}
	}
	// The agent's default working directory.
	os.MkdirAll("/root", 0o700)
	if err := loadModules("/etc/modules"); err != nil {
		return "", err
	}
	fmt.Println("guestinit: modules loaded")
	return findPort("isopod.agent", 10*time.Second)
}

// serve answers the host until it halts the machine.
func serve(dev string) {
	srv := agent.NewServer(agent.Options{ReapAll: true, Logger: agent.NewConsoleLogger(os.Stderr, false)})
	for {
		port, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "guestinit: open port: %v\n", err)
			poweroff()
		}
		err = srv.Serve(context.Background(), port)
		port.Close()
		if err == nil {
			poweroff()
		}
		// The machine keeps running until the host ends it; a host that
		// connects again finds the port open.
		fmt.Printf("guestinit: port closed (%v)\n", err)
		time.Sleep(200 * time.Millisecond)
	}
}

func tool(args []string) int {
	switch {
	case len(args) == 1 && args[0] == "disks":
		fmt.Print(disks())
		return 0
	case (len(args) == 3 || len(args) == 4) && args[0] == "write":
		var off int64
		if len(args) == 4 {
			off, _ = strconv.ParseInt(args[3], 10, 64)
		}
		if err := writeDisk(args[1], args[2], off); err != nil {
			fmt.Fprintf(os.Stderr, "guestinit write: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "usage: /init disks | /init write SERIAL TEXT [OFFSET]")
	return 2
}

func loadModules(list string) error {
	data, err := os.ReadFile(list)
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	for _, path := range strings.Fields(string(data)) {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("module %s: %w", path, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("finit_module %s: %w", path, err)
		}
	}
	return nil
}

func findPort(name string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(n))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio port named %s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func disks() string {
	var b strings.Builder
	serials, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, s := range serials {
		v, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", filepath.Base(filepath.Dir(s)), strings.TrimSpace(string(v)))
	}
	return b.String()
}

func writeDisk(serial, text string, off int64) error {
	serials, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, s := range serials {
		v, err := os.ReadFile(s)
		if err != nil || strings.TrimSpace(string(v)) != serial {
			continue
		}
		f, err := os.OpenFile("/dev/"+filepath.Base(filepath.Dir(s)), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte(text), off); err != nil {
			return err
		}
		return f.Sync()
	}
	return fmt.Errorf("no disk with serial %s", serial)
}

func poweroff() {
	time.Sleep(20 * time.Millisecond) // let the last reply leave
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	// Power-off returned: fall back to a reset, which ends a -no-reboot VM.
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}
