package admission

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// ReadHost reads this host's cores and memory (MemTotal; 0 when
// /proc/meminfo cannot be read), the facts that bound a run's sizes and
// the default limits; the caller fills the rest of Host.
func ReadHost() Host {
	h := Host{CPUs: runtime.NumCPU(), MemTotalMiB: 0}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return h
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(fields[1])
			h.MemTotalMiB = kb / 1024
		}
	}
	return h
}
