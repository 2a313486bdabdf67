package runs

import (
	"strings"
	"testing"

	"isopod/integration/e2e"
)

// TestCommandsCannotTakeTheAgentDown: a fork bomb and a memory bomb are
// contained in the command's cgroup (the agent keeps answering, the command
// is told so), and a guest that dies is a result, not an isopod failure.
func TestCommandsCannotTakeTheAgentDown(t *testing.T) {
	e2e.RequireVM(t)
	t.Run("fork bomb", func(t *testing.T) {
		// Once the bomb fills the cgroup, no fork succeeds, the shell's
		// own included: what the shell does after starting it is
		// builtins only (read -t on an empty FIFO waits 3 s).
		r := e2e.Run(t, "--no-network", "--timeout-s", "300", "--", "sh", "-c",
			"m=$(cat /sys/fs/cgroup/isopod/pids.max); mkfifo /tmp/p; exec 3<>/tmp/p; "+
				"echo before; f(){ f|f& }; f; read -t 3 x <&3; echo after $m")
		if e2e.Str(r.JSON, "stdout") != "before\nafter 4096\n" || r.JSON["guest_died"] != false {
			t.Errorf("fork bomb: %s", r)
		}
	})
	t.Run("memory bomb", func(t *testing.T) {
		r := e2e.Run(t, "--no-network", "--timeout-s", "300", "--", "sh", "-c",
			`awk 'BEGIN{s="x"; while(1) s=s s}'; echo "awk=$?"`)
		if e2e.Str(r.JSON, "stdout") != "awk=137\n" || r.JSON["guest_died"] != false {
			t.Errorf("memory bomb: the command should be killed (137) and the guest live on: %s", r)
		}
	})
	for _, tt := range []struct{ name, cmd, reason string }{
		{"power off", "echo x; poweroff -f", "powered off"},
		{"kernel crash", "echo c > /proc/sysrq-trigger", "kernel panic"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := e2e.Run(t, "--no-network", "--timeout-s", "120", "--", "sh", "-c", tt.cmd)
			if r.JSON["guest_died"] != true || !strings.Contains(e2e.Str(r.JSON, "guest_died_reason"), tt.reason) ||
				e2e.Str(r.JSON, "vm_id") == "" || r.JSON["exit_code"] != nil {
				t.Errorf("want a report with guest_died and a reason naming %q:\n%s", tt.reason, r)
			}
		})
	}
}
