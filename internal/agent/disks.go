package agent

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"isopod/internal/agentproto"
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

// knownDisks remembers what scans found. A disk keeps its serial and node
// for the guest's life (nothing is unplugged), and a clone resumed from a
// snapshot has the snapshot VM's disks, each slot backed by another file
// under the same serial: it finds them here without scanning again, which
// costs tens of milliseconds under emulation.
var knownDisks struct {
	sync.Mutex
	m map[string]map[string]string // by where they were scanned
}

// cachedDisks returns the disks known under sysBlock and devDir when every
// serial in want is among them.
func cachedDisks(sysBlock, devDir string, want []string) (map[string]string, bool) {
	knownDisks.Lock()
	defer knownDisks.Unlock()
	known, ok := knownDisks.m[sysBlock+"\x00"+devDir]
	if !ok {
		return nil, false
	}
	for _, s := range want {
		if _, ok := known[s]; !ok {
			return nil, false
		}
	}
	return maps.Clone(known), true
}

// rememberDisks adds what a scan under sysBlock and devDir found to
// knownDisks.
func rememberDisks(sysBlock, devDir string, found map[string]string) {
	knownDisks.Lock()
	defer knownDisks.Unlock()
	if knownDisks.m == nil {
		knownDisks.m = map[string]map[string]string{}
	}
	k := sysBlock + "\x00" + devDir
	if knownDisks.m[k] == nil {
		knownDisks.m[k] = map[string]string{}
	}
	maps.Copy(knownDisks.m[k], found)
}

// waitDisks polls until every disk with a serial in want has appeared or
// timeout passes. It returns what it found and an error naming the disks
// still missing.
func waitDisks(sysBlock, devDir string, want []string, timeout, every time.Duration) (map[string]string, error) {
	if found, ok := cachedDisks(sysBlock, devDir, want); ok {
		return found, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		found := scanDisks(sysBlock, devDir)
		rememberDisks(sysBlock, devDir, found)
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
