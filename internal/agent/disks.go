package agent

import (
	"fmt"
	"isopod/internal/agentproto"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Disk serials (see agentproto's guest contract).
const (
	SerialBase    = agentproto.SerialBase
	SerialScratch = agentproto.SerialScratch
)

// LayerSerial is the serial of stage layer i (0 is the oldest).
func LayerSerial(i int) string { return agentproto.LayerSerial(i) }

// wantedSerials are the disks a Mount names, beyond the base.
func wantedSerials(m agentproto.Mount) []string {
	var s []string
	for i := 0; i < m.Layers; i++ {
		s = append(s, LayerSerial(i))
	}
	if m.Scratch {
		s = append(s, SerialScratch)
	}
	if m.Workspace != "" {
		s = append(s, agentproto.SerialWorkspace, agentproto.SerialWorkspaceUpper)
	}
	return s
}

// scanDisks maps serial -> device node for every block device under
// sysBlock (/sys/block) whose node exists in devDir (/dev).
func scanDisks(sysBlock, devDir string) map[string]string {
	found := make(map[string]string)
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return found
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "serial"))
		if err != nil {
			continue
		}
		serial := strings.Trim(string(b), " \t\r\n\x00")
		if serial == "" {
			continue
		}
		dev := filepath.Join(devDir, e.Name())
		if _, err := os.Stat(dev); err != nil {
			continue
		}
		found[serial] = dev
	}
	return found
}

// waitDisks polls until every disk with a serial in want has appeared or
// timeout passes. It returns what it found and an error naming the disks
// still missing.
func waitDisks(sysBlock, devDir string, want []string, timeout, every time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		found := scanDisks(sysBlock, devDir)
		var missing []string
		for _, s := range want {
			if _, ok := found[s]; !ok {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			return found, nil
		}
		if time.Now().After(deadline) {
			return found, fmt.Errorf("disks with serial %s did not appear within %s (found: %s)",
				strings.Join(missing, ", "), timeout, describeFound(found))
		}
		time.Sleep(every)
	}
}

func describeFound(found map[string]string) string {
	if len(found) == 0 {
		return "none"
	}
	var s []string
	for serial, dev := range found {
		s = append(s, serial+"="+dev)
	}
	return strings.Join(s, " ")
}

// layerDevices returns the n layer disks in order l0, l1, ...
func layerDevices(found map[string]string, n int) ([]string, error) {
	var devs []string
	for i := 0; i < n; i++ {
		dev, ok := found[LayerSerial(i)]
		if !ok {
			return devs, fmt.Errorf("layer disk %s is missing", LayerSerial(i))
		}
		devs = append(devs, dev)
	}
	return devs, nil
}

// lowerDirs builds overlayfs's lowerdir value: the newest layer first, each
// layer's upper/ directory, then the base. A layer without upper/ (nothing
// was written in that stage) is skipped.
func lowerDirs(layerMounts []string, base string) (string, []string) {
	var dirs, skipped []string
	for i := len(layerMounts) - 1; i >= 0; i-- {
		up := filepath.Join(layerMounts[i], "upper")
		if fi, err := os.Stat(up); err != nil || !fi.IsDir() {
			skipped = append(skipped, layerMounts[i])
			continue
		}
		dirs = append(dirs, up)
	}
	dirs = append(dirs, base)
	return strings.Join(dirs, ":"), skipped
}
