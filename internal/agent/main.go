package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// Main is the isopod-agent program. As PID 1 it boots the guest and serves
// the host forever (it never returns). As any other process it serves one
// connection on stdin and stdout, without touching the machine, and exits
// when the stream ends; "--version" prints the versions. With ExecStubArg
// it is an exec stub (exec_stub.go).
func Main() {
	if len(os.Args) > 1 && os.Args[1] == ExecStubArg {
		RunExecStub()
	}
	if os.Getpid() == 1 && len(os.Args) > 1 && os.Args[1] == FloorArg {
		// The benchmark floor: the same kernel and initramfs, an init that
		// does nothing but power off.
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "--version", "-version", "version":
			fmt.Printf("isopod-agent %s (protocol %d)\n", Version, ProtoVersion())
			return
		default:
			fmt.Fprintf(os.Stderr, "usage: isopod-agent [--version]\n"+
				"As PID 1 it boots an isopod guest; otherwise it serves the agent protocol on stdin/stdout.\n")
			os.Exit(2)
		}
	}
	if os.Getpid() != 1 {
		os.Exit(serveStdio())
	}
	runPID1()
}

// FloorArg, given to init on the kernel command line, makes PID 1 power off
// at once: the floor isopod's boot is measured against.
const FloorArg = agentproto.FloorArg

type stdio struct {
	io.Reader
	io.Writer
}

func serveStdio() int {
	log := NewConsoleLogger(os.Stderr, os.Getenv(agentproto.AgentDebugEnv) == "1")
	err := Serve(context.Background(), stdio{os.Stdin, os.Stdout}, Options{Logger: log})
	if err != nil && !errors.Is(err, io.EOF) {
		log.Error("serving ended", "err", err)
		return 1
	}
	return 0
}

// runPID1 boots and then serves the agent port forever. PID 1 must never
// exit: the kernel would panic.
func runPID1() {
	log := NewConsoleLogger(os.Stderr, false)
	log.Info("starting", "version", Version, "protocol", ProtoVersion())
	globalReaper() // reap orphans from the very start
	info, log := boot(log)
	bootErr := oneLine(info.err)
	sys := &linuxSystem{log: log}
	srv := NewServer(Options{
		Logger:   log,
		ReapAll:  true,
		System:   sys,
		Cgroups:  info.cgroups,
		ExecStub: "/proc/self/exe",
		Hello: func() agentproto.Hello {
			h := DefaultHello()
			h.BootError = bootErr
			h.ModulesMS = float64(info.modules.Microseconds()) / 1000
			return h
		},
	})
	ready := false
	backoff := 50 * time.Millisecond
	for {
		dev, err := waitPort("/sys/class/virtio-ports", "/dev", PortName, 10*time.Second, 5*time.Millisecond)
		if err != nil {
			log.Error("agent port not found; still waiting", "err", err)
			continue
		}
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			log.Error("opening the agent port", "port", dev, "err", err)
			time.Sleep(time.Second)
			continue
		}
		if !ready {
			log.Info("ready")
			ready = true
		}
		t0 := time.Now()
		err = srv.Serve(context.Background(), f)
		f.Close()
		if err == nil {
			powerOff(log)
			continue
		}
		// A host that is not connected reads as EOF at once; back off so a
		// disconnected port does not spin.
		if time.Since(t0) > time.Second {
			backoff = 50 * time.Millisecond
		} else if backoff < time.Second {
			backoff *= 2
		}
		log.Debug("connection ended; reopening the port", "err", err)
		time.Sleep(backoff)
	}
}

// powerOff turns the VM off after giving the last reply a moment to leave.
func powerOff(log interface{ Error(string, ...any) }) {
	time.Sleep(20 * time.Millisecond)
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	log.Error("power off failed; still serving", "err", err)
}
