package qemu

import (
	"encoding/json"
	"os"
	"time"
)

// ProbeVerdict is the last KVM probe a probe cache remembers (see
// Config.ProbeCache): whether QEMU could run a guest under KVM on this
// host, and if not, why.
type ProbeVerdict struct {
	KVM    bool
	Reason string
	At     time.Time
}

// LastProbe reads the probe cache file; ok is false when no probe was
// recorded there. The verdict may be of another QEMU, kernel or host boot
// than the next run's, which probes again.
func LastProbe(cacheFile string) (v ProbeVerdict, ok bool) {
	b, err := os.ReadFile(cacheFile)
	if err != nil {
		return ProbeVerdict{}, false
	}
	var rec probeRecord
	if json.Unmarshal(b, &rec) != nil || rec.At.IsZero() {
		return ProbeVerdict{}, false
	}
	return ProbeVerdict{KVM: rec.KVM, Reason: rec.Reason, At: rec.At}, true
}
