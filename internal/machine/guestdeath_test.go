package machine

import (
	"strings"
	"testing"
)

func TestDeathReason(t *testing.T) {
	for _, tt := range []struct {
		name, console, want string
	}{
		{"panic", "[    1.0] foo\n[    2.5] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009\n[    2.6] Kernel Offset: disabled\n",
			"kernel panic: Attempted to kill init! exitcode=0x00000009"},
		{"sysrq", "[ 3.1] sysrq: Trigger a crash\n[ 3.1] Kernel panic - not syncing: sysrq triggered crash\n", "kernel panic: sysrq triggered crash"},
		{"power off", "[ 9.0] reboot: Power down\n", "the guest powered off"},
		{"oom", "[ 4.0] Out of memory: Killed process 99 (python3)\n[ 4.1] reboot: Restarting system\n", "out of memory: Killed process 99 (python3)"},
		{"last line", "boot\nsomething odd\n\n", "the guest stopped; its console ended with: something odd"},
		{"silent", "", "the guest stopped without a word on its console"},
	} {
		if got := deathReason([]byte(tt.console)); got != tt.want {
			t.Errorf("%s: %q; want %q", tt.name, got, tt.want)
		}
	}
	long := deathReason([]byte("Kernel panic - not syncing: " + strings.Repeat("é", 300)))
	if len(long) > 210 || !strings.HasSuffix(long, "…") {
		t.Errorf("long reason not clipped: %d bytes", len(long))
	}
}
