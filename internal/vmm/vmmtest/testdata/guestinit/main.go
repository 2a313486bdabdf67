// Command guestinit is the /init of the tiny initramfs that vmmtest builds
// for driver boot tests. It loads the kernel modules listed in /etc/modules,
// opens the virtio-serial port named isopod.agent, announces itself with one
// line and then serves line commands from the host:
//
//	ECHO text         -> "ECHO text"
//	DISKS             -> "DISK vdX serial" per disk, then "END"
//	WRITE serial text -> writes text at offset 0 of that disk and fsyncs;
//	                     "OK" or "ERR message"
//	POWEROFF          -> syncs and powers the machine off
//
// When the host closes the channel it says so on the console and idles.
// Anything it cannot do it reports on the console and powers off.
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "guestinit: %v\n", err)
	}
	poweroff()
}

func run() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && err != syscall.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// The initramfs has no /dev/console node; take the console now.
	if c, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := 0; fd < 3; fd++ {
			unix.Dup3(int(c.Fd()), fd, 0)
		}
	}
	if err := loadModules("/etc/modules"); err != nil {
		return err
	}
	fmt.Println("guestinit: modules loaded")
	dev, err := findPort("isopod.agent", 10*time.Second)
	if err != nil {
		return err
	}
	port, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open port: %w", err)
	}
	defer port.Close()
	if _, err := port.WriteString("HELLO isopod\n"); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	sc := bufio.NewScanner(port)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		var reply string
		switch cmd {
		case "ECHO":
			reply = "ECHO " + arg
		case "DISKS":
			reply = disks() + "END"
		case "WRITE":
			serial, text, _ := strings.Cut(arg, " ")
			reply = "OK"
			if err := writeDisk(serial, text); err != nil {
				reply = "ERR " + err.Error()
			}
		case "POWEROFF":
			syscall.Sync()
			return nil
		default:
			reply = "ERR unknown command " + cmd
		}
		if _, err := port.WriteString(reply + "\n"); err != nil {
			return fmt.Errorf("write reply: %w", err)
		}
	}
	// The host closed the channel; the machine keeps running until the
	// host ends it.
	fmt.Printf("guestinit: port closed (%v)\n", sc.Err())
	select {}
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
		fmt.Fprintf(&b, "DISK %s %s\n", filepath.Base(filepath.Dir(s)), strings.TrimSpace(string(v)))
	}
	return b.String()
}

func writeDisk(serial, text string) error {
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
		if _, err := f.WriteAt([]byte(text), 0); err != nil {
			return err
		}
		return f.Sync()
	}
	return fmt.Errorf("no disk with serial %s", serial)
}

func poweroff() {
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	// Power-off returned: fall back to a reset, which ends a -no-reboot VM.
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}
