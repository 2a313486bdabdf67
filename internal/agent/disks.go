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

// diskWant says which disks boot waits for.
type diskWant struct {
	layers  int  // exact count; -1 means take what is there with the base
	scratch bool // wait for the scratch disk
}

func (w diskWant) serials() []string {
	s := []string{SerialBase}
	for i := 0; i < w.layers; i++ {
		s = append(s, LayerSerial(i))
	}
	if w.scratch {
		s = append(s, SerialScratch)
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

// waitDisks polls until every wanted disk has appeared or timeout passes.
// It returns what it found and an error naming the disks still missing.
func waitDisks(sysBlock, devDir string, want diskWant, timeout, every time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		found := scanDisks(sysBlock, devDir)
		var missing []string
		for _, s := range want.serials() {
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

// layerDevices returns the layer disks in order l0, l1, ... When the count
// is unknown it takes the consecutive run that starts at l0.
func layerDevices(found map[string]string, want diskWant) ([]string, error) {
	var devs []string
	n := want.layers
	if n < 0 {
		n = MaxLayers
	}
	for i := 0; i < n; i++ {
		dev, ok := found[LayerSerial(i)]
		if !ok {
			if want.layers < 0 {
				break
			}
			return devs, fmt.Errorf("layer disk %s is missing", LayerSerial(i))
		}
		devs = append(devs, dev)
	}
	if want.layers < 0 {
		if _, gap := found[LayerSerial(len(devs)+1)]; gap {
			return devs, fmt.Errorf("layer disks are not consecutive: %s is missing", LayerSerial(len(devs)))
		}
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
