// Package e2e is the harness of isopod's end-to-end tests (the packages
// beside it): it builds the real binaries once per test binary and runs them.
// The tests boot real microVMs under QEMU (KVM where usable, TCG otherwise)
// and run real programs in the guest.
//
// Each test binary runs in a private state root (see [PrivateHome]) that
// links the kernel, images and warm-pool snapshots of the user's
// $ISOPOD_HOME (default ~/.isopod), which scripts/install.sh fetches and
// builds, and is removed afterwards: the tests never write to the user's
// own store. They skip with that hint when the images are missing, and
// under -short.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/paths"
	"isopod/internal/testnet"
)

var (
	// BinDir holds the built isopod, isopod-mcp, isopod-agent and isopod-jail.
	BinDir string
	// HomeDir is the test binary's private state root, the one every
	// isopod it starts uses.
	HomeDir string
	// SourceHome is the user's state root, whose kernel and images HomeDir
	// links.
	SourceHome string
)

// Main is a test package's TestMain: it builds the binaries, runs the tests
// in a private state root and returns the exit code.
func Main(m *testing.M) int {
	return func() int {
		flag.Parse()
		if testing.Short() {
			return PrivateHome(m)
		}
		dir, err := os.MkdirTemp("", "isopod-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		BinDir = dir
		if out, err := exec.Command("go", "build", "-o", dir+"/", "isopod/cmd/isopod", "isopod/cmd/isopod-mcp").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building isopod: %v\n%s", err, out)
			return 1
		}
		// The guest agent must be static; the jail helper is, like a
		// release's, and beside isopod it starts every VMM.
		for _, name := range []string{"isopod-agent", "isopod-jail"} {
			build := exec.Command("go", "build", "-o", filepath.Join(dir, name), "isopod/cmd/"+name)
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "building %s: %v\n%s", name, err, out)
				return 1
			}
		}
		return privateHome(m, freshInitramfs)
	}()
}

// freshInitramfs makes the guests of the private state root boot the agent
// built from this tree: when the installed initramfs holds another agent
// (the tree changed since install.sh ran), it is rebuilt there, replacing
// the link to the installed one, which stays as it was.
func freshInitramfs() error {
	var side struct {
		AgentSHA256 string `json:"agent_sha256"`
	}
	b, err := os.ReadFile(filepath.Join(HomeDir, "images", "initramfs.json"))
	if err != nil {
		return nil // nothing installed: the tests that need it skip
	}
	if err := json.Unmarshal(b, &side); err != nil {
		return fmt.Errorf("reading the initramfs record: %w", err)
	}
	agent, err := os.ReadFile(filepath.Join(BinDir, "isopod-agent"))
	if err != nil {
		return err
	}
	if side.AgentSHA256 == fmt.Sprintf("%x", sha256.Sum256(agent)) {
		return nil
	}
	fmt.Fprintln(os.Stderr, "e2e: the installed initramfs holds another agent; rebuilding it in the private state root")
	out, err := exec.Command(filepath.Join(BinDir, "isopod"), "image", "build", "initramfs").CombinedOutput()
	if err != nil {
		return fmt.Errorf("rebuilding the initramfs: %v\n%s", err, out)
	}
	return nil
}

// RequireVM skips unless end-to-end tests can boot VMs here.
func RequireVM(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped under -short")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed: run ./scripts/install.sh")
	}
	if _, err := os.Stat(filepath.Join(HomeDir, "images", "base-min.sqfs")); err != nil {
		t.Skipf("base-min not built under %s: run ./scripts/install.sh", SourceHome)
	}
}

// RequireDebian skips unless the base-debian image is built.
func RequireDebian(t testing.TB) {
	t.Helper()
	RequireVM(t)
	if _, err := os.Stat(filepath.Join(HomeDir, "images", "base-debian.sqfs")); err != nil {
		t.Skipf("base-debian not built under %s: run `isopod image build base-debian` (or ISOPOD_INSTALL_DEBIAN=1 ./scripts/install.sh)", SourceHome)
	}
}

// Result is one isopod invocation.
type Result struct {
	Code   int
	Stdout []byte
	Stderr []byte
	JSON   map[string]any
}

func (r *Result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, tail(r.Stderr, 2000))
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Isopod runs the CLI with env added to the test environment.
func Isopod(t testing.TB, env []string, args ...string) *Result {
	t.Helper()
	r := invoke(t, 10*time.Minute, filepath.Join(BinDir, "isopod"), args, env, args)
	if lines := bytes.Count(bytes.TrimSpace(r.Stdout), []byte("\n")); lines != 0 {
		t.Fatalf("isopod %v: stdout is not exactly one JSON object:\n%s", args, r)
	}
	return r
}

// NSIsopod runs the CLI inside the test network's host namespace, whose
// resolver is the fixture's DNS server.
func NSIsopod(t testing.TB, n *testnet.Net, args ...string) *Result {
	t.Helper()
	c := n.Command(n.Host, filepath.Join(BinDir, "isopod"), args...)
	return invoke(t, 5*time.Minute, c.Path, c.Args[1:], nil, args)
}

// invoke runs name with argv, env added to the test environment, under
// timeout, and parses stdout as one JSON object. args, the isopod
// arguments, name the call in failures.
func invoke(t testing.TB, timeout time.Duration, name string, argv, env, args []string) *Result {
	t.Helper()
	return invokeIn(t, timeout, name, argv, env, args, nil)
}

// RunStdin is Run with stdin as isopod's own standard input.
func RunStdin(t testing.TB, stdin []byte, args ...string) *Result {
	t.Helper()
	args = append([]string{"run"}, args...)
	r := invokeIn(t, 10*time.Minute, filepath.Join(BinDir, "isopod"), args, nil, args, stdin)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v failed:\n%s", args, r)
	}
	return r
}

// invokeIn is invoke with stdin (nil: none).
func invokeIn(t testing.TB, timeout time.Duration, name string, argv, env, args []string, stdin []byte) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Env = append(append(os.Environ(), "ISOPOD_AGENT_BIN="+filepath.Join(BinDir, "isopod-agent")), env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := &Result{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.Code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("isopod %v: %v", args, err)
	}
	if err := json.Unmarshal(r.Stdout, &r.JSON); err != nil {
		t.Fatalf("isopod %v: stdout is not one JSON object: %v\n%s", args, err, r)
	}
	return r
}

// Run is `isopod run` that must succeed as an isopod call.
func Run(t testing.TB, args ...string) *Result {
	t.Helper()
	r := Isopod(t, nil, append([]string{"run"}, args...)...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run %v failed:\n%s", args, r)
	}
	return r
}

// RunFail is an isopod call that must fail with an error containing want.
func RunFail(t testing.TB, env []string, want string, args ...string) *Result {
	t.Helper()
	r := Isopod(t, env, args...)
	if r.Code != 1 || r.JSON["ok"] != false {
		t.Fatalf("isopod %v: want failure, got:\n%s", args, r)
	}
	if msg, _ := r.JSON["error"].(string); !strings.Contains(msg, want) {
		t.Fatalf("isopod %v: error %q does not mention %q", args, msg, want)
	}
	return r
}

func Num(t testing.TB, m map[string]any, key string) int64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("report has no number %q: %v", key, m)
	}
	return int64(v)
}

func Str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// QEMUPIDs lists running QEMU processes whose command line names vm.
func QEMUPIDs(t testing.TB, vm string) []int {
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

// VMCgroups lists the cgroup directories of VM vm's VMM under HomeDir's
// scope, in every hierarchy mounted under /sys/fs/cgroup (none where the
// jail gave it none).
func VMCgroups(vm string) []string {
	p, err := paths.New(HomeDir)
	if err != nil {
		return nil
	}
	name := "isopod-" + p.Scope() + "-" + vm
	var found []string
	filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == name {
			found = append(found, path)
			return filepath.SkipDir
		}
		if strings.Count(path, "/") > 8 {
			return filepath.SkipDir
		}
		return nil
	})
	return found
}

// Itoa formats n.
func Itoa(n int64) string { return strconv.FormatInt(n, 10) }

// VMOfOwner finds the VM record written by process pid.
func VMOfOwner(pid int) string {
	ents, _ := os.ReadDir(filepath.Join(HomeDir, "vms"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(HomeDir, "vms", e.Name(), "record.json"))
		if err == nil && bytes.Contains(b, []byte(`"owner_pid": `+Itoa(int64(pid))+",")) {
			return e.Name()
		}
	}
	return ""
}

// FileSHA is the sha256 of a file, in hex.
func FileSHA(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return fmt.Sprintf("%x", h.Sum(nil))
}

// BenchEnabled reports whether benchmark-only tests should run.
func BenchEnabled() bool { return os.Getenv("ISOPOD_BENCH") == "1" }

// Parallel runs call(0) … call(n-1) at once and returns their results in
// order.
func Parallel(n int, call func(i int) *Result) []*Result {
	rs := make([]*Result, n)
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = call(i)
		}()
	}
	wg.Wait()
	return rs
}

// LockedBuffer collects a subprocess's output; safe for the writer and a
// reader at once.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
