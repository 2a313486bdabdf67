package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/testaccount"
	"isopod/internal/testnet"
)

// userReport is what these tests read of a run's report.
type userReport struct {
	OK       bool     `json:"ok"`
	ExitCode int      `json:"exit_code"`
	Stdout   string   `json:"stdout"`
	Stderr   string   `json:"stderr"`
	Error    string   `json:"error"`
	Warnings []string `json:"warnings"`
}

// runAs runs cmd (a's `isopod run`) and parses its report.
func runAs(t *testing.T, a testaccount.Account, cmd *exec.Cmd) userReport {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var rep userReport
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		t.Fatalf("isopod run as %s: %v; stdout is not one JSON object (%v)\nstdout: %s\nstderr: %s", a.Name, err, jerr, out.Bytes(), errb.Bytes())
	}
	if err != nil || !rep.OK || rep.ExitCode != 0 {
		t.Fatalf("isopod run as %s: %v\nstdout: %s\nstderr: %s", a.Name, err, out.Bytes(), errb.Bytes())
	}
	return rep
}

// checkUserWarnings: the report warns of the rlimit fallback on cgroup
// v1, and of nothing that weakens the jail further.
func checkUserWarnings(t *testing.T, rep userReport) {
	t.Helper()
	v1 := false
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); errors.Is(err, fs.ErrNotExist) {
		v1 = true
	}
	has := func(s string) bool {
		for _, w := range rep.Warnings {
			if strings.Contains(w, s) {
				return true
			}
		}
		return false
	}
	if v1 && !has("capped with rlimits instead") {
		t.Errorf("cgroup v1: the report does not warn of the rlimit fallback: %q", rep.Warnings)
	}
	if has("your own uid") || has("unconfined") {
		t.Errorf("the report warns of a weaker jail: %q", rep.Warnings)
	}
}

// TestUserPathWithoutSbin runs isopod as a new normal user would on
// Debian: PATH without /usr/sbin (where mkfs.ext4 and debugfs are), a
// state root with the kernel and images and no scratch disk template, so
// that the first run makes one with mkfs.ext4. A --no-network run, then a
// NAT run that fetches a page from the test network, both succeed, with
// the VMM jailed under a subordinate id (rlimits on cgroup v1).
func TestUserPathWithoutSbin(t *testing.T) {
	e2e.RequireVM(t)
	if err := unprivilegedUserNamespaces(); err != nil {
		t.Skipf("unprivileged user namespaces are not allowed here: %v", err)
	}
	a := testaccount.New(t, accountPrefix)
	home, bin := userHome(t, a, false)
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)

	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "ISOPOD_HOME=" + home, "ISOPOD_AGENT_BIN=" + filepath.Join(bin, "isopod-agent"), "ISOPOD_WARM_POOL=off"}
	isopod := filepath.Join(bin, "isopod")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	t.Run("no network", func(t *testing.T) {
		cmd := a.Command(ctx, env, isopod, "run", "--no-network", "--", "echo", "no-network-ok")
		cmd.Dir = home
		rep := runAs(t, a, cmd)
		if rep.Stdout != "no-network-ok\n" {
			t.Errorf("stdout %q", rep.Stdout)
		}
		checkUserWarnings(t, rep)
		if m, _ := filepath.Glob(filepath.Join(home, "images", "scratch-*.ext4")); len(m) == 0 {
			t.Errorf("the run made no scratch template under %s", home)
		}
	})
	t.Run("nat", func(t *testing.T) {
		// a's isopod in the test network's host namespace: root enters
		// it, then drops to a.
		user := a.Command(ctx, env, isopod, "run", "--", "wget", "-q", "-O-", "http://"+testnet.PublicIP+testnet.HelloPath)
		ns := n.Command(n.Host, user.Path, user.Args[1:]...)
		cmd := exec.CommandContext(ctx, ns.Path, ns.Args[1:]...)
		cmd.Env, cmd.Dir, cmd.WaitDelay = user.Env, home, user.WaitDelay
		rep := runAs(t, a, cmd)
		if rep.Stdout != testnet.HelloBody {
			t.Errorf("stdout %q, stderr %q; want the test network's page", rep.Stdout, rep.Stderr)
		}
		checkUserWarnings(t, rep)
	})
}
