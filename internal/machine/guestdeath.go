package machine

import (
	"bytes"
	"io"
	"os"
	"strings"
	"time"
)

// deathWait bounds how long Died waits for a VMM whose guest went away to
// exit (and its console to drain) before killing it.
const deathWait = 3 * time.Second

// consoleTail is how much of the end of the console a death reason is
// looked for in.
const consoleTail = 16 << 10

// Died ends a VM whose guest went away (its agent channel closed, or its
// VMM exited): it waits a little for the VMM to exit and its console to
// drain, reaps it, and says why the guest went, from the end of its
// console log at consolePath.
func (v *Machine) Died(consolePath string) (reason string) {
	if m, _ := v.Current(); m != nil {
		select {
		case <-m.Done():
		case <-time.After(deathWait):
		}
	}
	v.Drop()
	return deathReason(readTail(consolePath, consoleTail))
}

// readTail returns up to n bytes from the end of the file at path.
func readTail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b
}

// deathMarkers are console lines that say why a guest stopped, most
// telling first; the text after the marker is kept.
var deathMarkers = []struct{ marker, reason string }{
	{"Kernel panic - not syncing:", "kernel panic:"},
	{"sysrq: Trigger a crash", "crashed through sysrq"},
	{"Out of memory:", "out of memory:"},
	{"reboot: Power down", "the guest powered off"},
	{"reboot: System halted", "the guest halted"},
	{"reboot: Restarting system", "the guest rebooted"},
}

// deathReason names why a guest stopped from the end of its console: the
// most telling marker found, else the last non-empty line, else a generic
// reason.
func deathReason(tail []byte) string {
	lines := strings.Split(string(bytes.ToValidUTF8(tail, []byte("?"))), "\n")
	for _, d := range deathMarkers {
		for i := len(lines) - 1; i >= 0; i-- {
			_, after, ok := strings.Cut(lines[i], d.marker)
			if !ok {
				continue
			}
			reason := d.reason
			if strings.HasSuffix(reason, ":") {
				reason += " " + strings.TrimSpace(after)
			}
			return clip(reason, 200)
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return clip("the guest stopped; its console ended with: "+l, 200)
		}
	}
	return "the guest stopped without a word on its console"
}

// clip shortens s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
