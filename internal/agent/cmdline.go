package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Kernel command line keys the agent reads.
const (
	cmdHostname = "isopod.hostname" // sethostname at boot
	cmdLayers   = "isopod.layers"   // how many stage layer disks to wait for
	cmdUpper    = "isopod.upper"    // "ram": the upper layer is a tmpfs, no scratch disk
	cmdDebug    = "isopod.debug"    // "1": debug log lines on the console
)

// MaxLayers is how many stage layer disks the guest supports (serials
// isopod-l0 .. isopod-l9).
const MaxLayers = 10

// bootParams are the isopod.* keys of the kernel command line.
type bootParams struct {
	hostname string
	layers   int // -1 when not given
	ramUpper bool
	debug    bool
}

// parseCmdline reads the isopod.* keys from a kernel command line. Unknown
// isopod.* keys are reported so a typo is visible on the console.
func parseCmdline(line string) (bootParams, []error) {
	p := bootParams{layers: -1}
	var errs []error
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		if !strings.HasPrefix(k, "isopod.") {
			continue
		}
		switch k {
		case cmdHostname:
			if err := validHostname(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
				continue
			}
			p.hostname = v
		case cmdLayers:
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > MaxLayers {
				errs = append(errs, fmt.Errorf("%s=%q: want a number from 0 to %d", k, v, MaxLayers))
				continue
			}
			p.layers = n
		case cmdUpper:
			if v != "ram" && v != "disk" {
				errs = append(errs, fmt.Errorf("%s=%q: want ram or disk", k, v))
				continue
			}
			p.ramUpper = v == "ram"
		case cmdDebug:
			p.debug = v == "1" || v == "true"
		default:
			errs = append(errs, fmt.Errorf("unknown kernel command line key %s", k))
		}
	}
	return p, errs
}

func readCmdline(path string) (bootParams, []error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return bootParams{layers: -1}, []error{fmt.Errorf("reading the kernel command line: %w", err)}
	}
	return parseCmdline(string(b))
}
