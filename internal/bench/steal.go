package bench

import (
	"bufio"
	"math"
	"os"
	"strconv"
	"strings"
)

// A virtual host's hypervisor may take CPU time from it for other guests
// (steal): figures taken while it does are slower, and not comparable
// with another invocation's. A bench reports the share it saw, so that
// BENCHMARKS.md can say how contended the host was.

// cpuTimes is the host's CPU time from /proc/stat, in ticks: all of it,
// and the part stolen.
type cpuTimes struct{ total, steal uint64 }

// readCPUTimes reads the aggregate "cpu" line of /proc/stat; ok is false
// where there is none.
func readCPUTimes() (cpuTimes, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if t, ok := parseCPULine(sc.Text()); ok {
			return t, true
		}
	}
	return cpuTimes{}, false
}

// parseCPULine parses /proc/stat's aggregate line: "cpu" and the user,
// nice, system, idle, iowait, irq, softirq and steal ticks (guest time is
// already counted in user and nice).
func parseCPULine(line string) (cpuTimes, bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, s := range f[1:9] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += n
		if i == 7 {
			t.steal = n
		}
	}
	return t, true
}

// stealPct is the share of the host's CPU time stolen between a and b,
// in percent with one decimal; -1 when it cannot be told.
func stealPct(a, b cpuTimes) float64 {
	if b.total <= a.total || b.steal < a.steal {
		return -1
	}
	return math.Round(float64(b.steal-a.steal)/float64(b.total-a.total)*1000) / 10
}
