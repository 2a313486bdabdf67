package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// TestRootInNetworkNamespace runs `isopod run` as root in a network
// namespace the test makes, entered the two usual ways: `ip netns exec`,
// which remounts /sys so that no cgroup hierarchy is mounted inside, and
// `nsenter --net`, which keeps the host's. Both runs succeed; where no
// cgroup can be had the VMM is capped with rlimits and the report says so
// (as for a normal user without a cgroup), and where the hierarchies are
// there it gets its cgroup and no such warning.
func TestRootInNetworkNamespace(t *testing.T) {
	e2e.RequireVM(t)
	if os.Geteuid() != 0 {
		t.Skip("making a network namespace needs root")
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	ns := "isopodjn" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	for _, tt := range []struct {
		name  string
		enter []string
	}{
		{"ip netns exec", []string{"ip", "netns", "exec", ns}},
		{"nsenter", []string{"nsenter", "--net=/run/netns/" + ns, "--"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inside := func(argv ...string) *exec.Cmd {
				return exec.Command(tt.enter[0], append(append([]string(nil), tt.enter[1:]...), argv...)...)
			}
			// What the jail will find there: the unified hierarchy, or v1's
			// memory and pids ones, or none.
			cgroups := inside("sh", "-c", "test -e /sys/fs/cgroup/cgroup.controllers || "+
				"{ test -e /sys/fs/cgroup/memory/cgroup.procs && test -e /sys/fs/cgroup/pids/cgroup.procs; }").Run() == nil
			fsType, _ := inside("stat", "-fc", "%T", "/sys/fs/cgroup").Output()
			t.Logf("inside: /sys/fs/cgroup is %s, cgroup hierarchies mounted: %v", bytes.TrimSpace(fsType), cgroups)

			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			argv := append(append([]string(nil), tt.enter[1:]...), filepath.Join(e2e.BinDir, "isopod"), "run", "--", "echo", "in-netns-ok")
			cmd := exec.CommandContext(ctx, tt.enter[0], argv...)
			cmd.Env = append(os.Environ(), "ISOPOD_AGENT_BIN="+filepath.Join(e2e.BinDir, "isopod-agent"))
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			var rep userReport
			if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
				t.Fatalf("%v; stdout is not one JSON object (%v)\nstdout: %s\nstderr: %s", err, jerr, out.Bytes(), errb.Bytes())
			}
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if err != nil || !rep.OK || rep.Stdout != "in-netns-ok\n" {
				t.Fatalf("isopod run as root via %s: %v\nstdout: %s\nstderr: %s", tt.name, err, out.Bytes(), errb.Bytes())
			}
			var rlimits string
			for _, w := range rep.Warnings {
				if strings.Contains(w, "capped with rlimits instead") {
					rlimits = w
				}
			}
			switch {
			case !cgroups && rlimits == "":
				t.Errorf("no cgroup hierarchy inside, and no warning of the rlimit fallback: %q", rep.Warnings)
			case !cgroups && (!strings.Contains(rlimits, "ip netns exec") || !strings.Contains(rlimits, "nsenter --net=")):
				t.Errorf("the warning does not say why and how to keep cgroups: %q", rlimits)
			case cgroups && rlimits != "":
				t.Errorf("cgroup hierarchies inside, yet rlimits: %q", rlimits)
			}
		})
	}
}
