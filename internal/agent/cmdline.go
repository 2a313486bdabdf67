package agent

import (
	"fmt"
	"isopod/internal/agentproto"
	"os"
	"strings"
)

// MaxLayers is how many stage layer disks the guest supports.
const MaxLayers = agentproto.MaxLayers

// bootParams are the isopod.* keys of the kernel command line.
type bootParams struct {
	hostname string
	debug    bool
}

// parseCmdline reads the isopod.* keys from a kernel command line. Unknown
// isopod.* keys are reported so a typo is visible on the console.
func parseCmdline(line string) (bootParams, []error) {
	p := bootParams{}
	var errs []error
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		if !strings.HasPrefix(k, "isopod.") {
			continue
		}
		switch k {
		case agentproto.CmdlineHostname:
			if err := validHostname(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
				continue
			}
			p.hostname = v
		case agentproto.CmdlineDebug:
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
		return bootParams{}, []error{fmt.Errorf("reading the kernel command line: %w", err)}
	}
	return parseCmdline(string(b))
}
