package warmpool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// The MCP server keeps ready VMs: restored, paused VMs of the shapes it
// ran recently, each claimed by the next call of its shape.

// mcpServer is a built isopod-mcp on a state root, with a client.
type mcpServer struct {
	cs   *mcp.ClientSession
	home string
	logs *e2e.LockedBuffer
}

// startMCP starts isopod-mcp with env (ISOPOD_HOME first) and args. Whatever
// happens, no VMM of its state root outlives the test.
func startMCP(t *testing.T, env []string, args ...string) *mcpServer {
	t.Helper()
	s := &mcpServer{home: strings.TrimPrefix(env[0], "ISOPOD_HOME="), logs: new(e2e.LockedBuffer)}
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"), args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(append(os.Environ(), knobs.AgentBin+"="+filepath.Join(e2e.BinDir, "isopod-agent")), env...)
	cmd.Stderr = s.logs
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-warmpool-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("starting isopod-mcp: %v", err)
	}
	s.cs = cs
	t.Cleanup(func() {
		cs.Close()
		for _, pid := range e2e.VMMsOf(s.home) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("isopod-mcp stderr:\n%s", s.logs)
		}
	})
	return s
}

// call calls a tool and returns its structured result; isError results
// come back as an error carrying their text.
func (s *mcpServer) call(t *testing.T, tool string, args map[string]any) (map[string]any, error) {
	t.Helper()
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return nil, fmt.Errorf("%s", b.String())
	}
	var m map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		t.Fatalf("%s: structuredContent %s: %v", tool, b, err)
	}
	return m, nil
}

// run is sandbox_run of the hygiene line and cmd on base-min, which must
// exit 0; it checks the clone's hygiene (the MCP report calls the name
// vm_name) and returns the report and the command's own stdout.
func (s *mcpServer) run(t *testing.T, c *clones, what string, args map[string]any, cmd string) (map[string]any, string) {
	t.Helper()
	a := map[string]any{"cmd": hygieneCmd + "; " + cmd, "base": "base-min"}
	for k, v := range args {
		a[k] = v
	}
	before := time.Now()
	rep, err := s.call(t, "sandbox_run", a)
	after := time.Now()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if code, _ := rep["exit_code"].(float64); rep["exit_code"] == nil || code != 0 {
		t.Fatalf("%s: exit %v: %v", what, rep["exit_code"], rep)
	}
	rep["name"] = rep["vm_name"]
	return rep, c.check(t, what, &e2e.Result{JSON: rep}, before, after)
}

// readyVMs counts the server's live ready VMs (vm_list).
func (s *mcpServer) readyVMs(t *testing.T) int {
	t.Helper()
	l, err := s.call(t, "vm_list", nil)
	if err != nil {
		t.Fatalf("vm_list: %v", err)
	}
	n := 0
	vms, _ := l["vms"].([]any)
	for _, v := range vms {
		m := v.(map[string]any)
		if argv := fmt.Sprint(m["argv"]); m["live"] == true && argv == "[isopod ready]" {
			n++
		}
	}
	return n
}

// waitFor polls cond for up to limit.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); ; time.Sleep(250 * time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no %s after %v", what, limit)
		}
	}
}

// holders lists the QEMU processes of home that have the file fi open.
func holders(home string, fi os.FileInfo) []int {
	var out []int
	for _, pid := range e2e.VMMsOf(home) {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if st, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && os.SameFile(st, fi) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func TestMCPReadyVMs(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	// Room for a ready VM of two shapes besides a run (on a small host the
	// default limit keeps one background VM, and only while nothing runs).
	s := startMCP(t, env, "--max-vms", "4")
	c := newClones()

	// The first call of a shape boots cold; its snapshot is built after it.
	rep, _ := s.run(t, c, "first call", nil, "true")
	if rep["path"] != "cold" || rep["snapshot_built"] == true || rep["ready_vm"] == true {
		t.Errorf("first call: path %v snapshot_built %v ready_vm %v; want a cold boot, the snapshot built after it",
			rep["path"], rep["snapshot_built"], rep["ready_vm"])
	}
	waitFor(t, "snapshot built in the background", 5*time.Minute, func() bool { return len(listSnapshots(t, env)) == 1 })
	rep, _ = s.run(t, c, "second call", nil, "true")
	if rep["path"] != "warm" || rep["ready_vm"] == true {
		t.Errorf("second call: path %v ready_vm %v; want a plain resume", rep["path"], rep["ready_vm"])
	}

	t.Run("two calls in a row are served by ready VMs", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			waitFor(t, "ready VM", 3*time.Minute, func() bool { return s.readyVMs(t) >= 1 })
			rep, _ := s.run(t, c, fmt.Sprintf("ready call %d", i), nil, "true")
			if rep["path"] != "warm" || rep["ready_vm"] != true {
				t.Errorf("ready call %d: path %v ready_vm %v; want a ready VM", i, rep["path"], rep["ready_vm"])
			}
		}
	})

	t.Run("a ready VM holding a removed stage's layer is not handed to any run", func(t *testing.T) {
		reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		defer reg.Close()
		repo := strings.TrimPrefix(reg.URL, "http://") + "/warm/stages"

		rep, _ := s.run(t, c, "commit", map[string]any{"commit_as": "mcp-s"}, "mkdir -p /opt && echo s > /opt/s")
		id, _ := rep["stage_id"].(string)
		if id == "" {
			t.Fatalf("commit: no stage_id: %v", rep)
		}
		_, out := s.run(t, c, "fork", map[string]any{"stage": "mcp-s"}, "cat /opt/s")
		if out != "s\n" {
			t.Errorf("fork printed %q", out)
		}
		// The fork's shape (the warm key and the stage's layer) is hot now.
		waitFor(t, "ready VM of each shape", 3*time.Minute, func() bool { return s.readyVMs(t) >= 2 })
		layer := filepath.Join(s.home, "stages", id, "layer.ext4")
		fi, err := os.Stat(layer)
		if err != nil {
			t.Fatal(err)
		}
		if len(holders(s.home, fi)) == 0 {
			t.Fatalf("no QEMU of the server holds the stage's layer: the fork's ready VM is not there")
		}
		ok(t, env, "stage", "push", id, repo)
		if _, err := s.call(t, "stage_rm", map[string]any{"reference": id}); err != nil {
			t.Fatalf("stage_rm: %v", err)
		}
		if _, err := s.call(t, "sandbox_run", map[string]any{"cmd": "true", "stage": id}); err == nil {
			t.Errorf("a fork of the removed stage ran")
		}
		_, out = s.run(t, c, "call after stage_rm", nil, "test ! -e /opt/s && echo clean")
		if out != "clean\n" {
			t.Errorf("a base run after stage_rm printed %q", out)
		}
		// Nothing of the removed stage is kept: no ready VM holds its layer.
		waitFor(t, "release of the removed stage's layer", time.Minute, func() bool { return len(holders(s.home, fi)) == 0 })
		// The same stage again (its id is its bytes'): a fork of it is
		// served, but not by a VM made with the removed layer.
		ok(t, env, "stage", "pull", repo+":"+id, "--as", "mcp-s-again")
		rep, out = s.run(t, c, "fork of the stage pulled again", map[string]any{"stage": id}, "cat /opt/s")
		if out != "s\n" || rep["path"] != "warm" {
			t.Errorf("fork of the stage pulled again: path %v, printed %q", rep["path"], out)
		}
		if rep["ready_vm"] == true {
			t.Errorf("a ready VM made before the stage was removed served a fork of it")
		}
	})

	// Closing the server ends every VM it kept.
	s.cs.Close()
	waitFor(t, "end of the server's VMs", time.Minute, func() bool { return len(e2e.VMMsOf(s.home)) == 0 })
	vms, _ := ok(t, env, "vm", "ls")["vms"].([]any)
	for _, v := range vms {
		if m := v.(map[string]any); m["live"] == true {
			t.Errorf("a VM is live after the server closed: %v", m)
		}
	}
}
