package agent

import (
	"fmt"
	"isopod/internal/agentproto"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// PortName is the name of the virtio-serial port the agent serves on.
const PortName = agentproto.PortName

// findPort returns the device node of the virtio-serial port named name:
// the vportNpM directory under sysPorts (/sys/class/virtio-ports) whose
// name file matches, as a node in devDir (/dev).
func findPort(sysPorts, devDir, name string) (string, error) {
	ents, err := os.ReadDir(sysPorts)
	if err != nil {
		return "", fmt.Errorf("listing virtio ports: %w", err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "vport") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysPorts, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Join(devDir, e.Name())
		if _, err := os.Stat(dev); err != nil {
			return "", fmt.Errorf("port %s: %w", name, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("no virtio-serial port named %s", name)
}

// waitPort polls for the port until timeout.
func waitPort(sysPorts, devDir, name string, timeout, every time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		dev, err := findPort(sysPorts, devDir, name)
		if err == nil || time.Now().After(deadline) {
			return dev, err
		}
		time.Sleep(every)
	}
}
