// Package integration holds isopod's end-to-end tests: they build the real
// binaries once, boot real microVMs under QEMU (KVM where usable, TCG
// otherwise) and run real programs in the guest.
//
// They use the images under $ISOPOD_HOME (default ~/.isopod), which
// scripts/install.sh fetches and builds, and skip with that hint when they are
// missing. They are skipped under -short.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	binDir  string // built binaries
	homeDir string // the state root with the images
)

func TestMain(m *testing.M) {
	code := func() int {
		flag.Parse()
		if testing.Short() {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "isopod-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		if out, err := exec.Command("go", "build", "-o", dir+"/", "isopod/cmd/isopod", "isopod/cmd/isopod-mcp").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building isopod: %v\n%s", err, out)
			return 1
		}
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "isopod-agent"), "isopod/cmd/isopod-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building isopod-agent: %v\n%s", err, out)
			return 1
		}
		homeDir = os.Getenv("ISOPOD_HOME")
		if homeDir == "" {
			h, _ := os.UserHomeDir()
			homeDir = filepath.Join(h, ".isopod")
		}
		return m.Run()
	}()
	os.Exit(code)
}

// requireVM skips unless end-to-end tests can boot VMs here.
func requireVM(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped under -short")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed: run ./scripts/install.sh")
	}
	if _, err := os.Stat(filepath.Join(homeDir, "images", "base-min.sqfs")); err != nil {
		t.Skipf("base-min not built under %s: run ./scripts/install.sh", homeDir)
	}
}

// requireDebian skips unless the base-debian image is built.
func requireDebian(t testing.TB) {
	t.Helper()
	requireVM(t)
	if _, err := os.Stat(filepath.Join(homeDir, "images", "base-debian.sqfs")); err != nil {
		t.Skipf("base-debian not built under %s: run `isopod image build base-debian` (or ISOPOD_INSTALL_DEBIAN=1 ./scripts/install.sh)", homeDir)
	}
}

// result is one isopod invocation.
type result struct {
	Code   int
	Stdout []byte
	Stderr []byte
	JSON   map[string]any
}

func (r *result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, tail(r.Stderr, 2000))
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// isopod runs the CLI with env added to the test environment.
func isopod(t testing.TB, env []string, args ...string) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "isopod"), args...)
	cmd.Env = append(append(os.Environ(), "ISOPOD_AGENT_BIN="+filepath.Join(binDir, "isopod-agent")), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := &result{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.Code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("isopod %v: %v", args, err)
	}
	if lines := bytes.Count(bytes.TrimSpace(r.Stdout), []byte("\n")); lines != 0 {
		t.Fatalf("isopod %v: stdout is not exactly one JSON object:\n%s", args, r)
	}
	if err := json.Unmarshal(r.Stdout, &r.JSON); err != nil {
		t.Fatalf("isopod %v: stdout is not JSON: %v\n%s", args, err, r)
	}
	return r
}

// run is `isopod run` that must succeed as an isopod call.
func run(t testing.TB, args ...string) *result {
	t.Helper()
	r := isopod(t, nil, append([]string{"run"}, args...)...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run %v failed:\n%s", args, r)
	}
	return r
}

// runFail is an isopod call that must fail with an error containing want.
func runFail(t testing.TB, env []string, want string, args ...string) *result {
	t.Helper()
	r := isopod(t, env, args...)
	if r.Code != 1 || r.JSON["ok"] != false {
		t.Fatalf("isopod %v: want failure, got:\n%s", args, r)
	}
	if msg, _ := r.JSON["error"].(string); !strings.Contains(msg, want) {
		t.Fatalf("isopod %v: error %q does not mention %q", args, msg, want)
	}
	return r
}

func num(t testing.TB, m map[string]any, key string) int64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("report has no number %q: %v", key, m)
	}
	return int64(v)
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// qemuPIDs lists running QEMU processes whose command line names vm.
func qemuPIDs(t testing.TB, vm string) []int {
	t.Helper()
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte("qemu-system")) && bytes.Contains(cmdline, []byte(vm)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
