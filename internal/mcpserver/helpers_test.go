package mcpserver

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/vmrecord"
)

// scriptedCore stands in for the VM-backed core where a test needs to
// control timing or failures the real core cannot produce on demand. It
// records what the server asked for.
type scriptedCore struct {
	mu     sync.Mutex
	reqs   []sandbox.Request
	stdins []string
	run    func(ctx context.Context, req sandbox.Request) (*report.Run, error)
	images *stages.ImageListResult
	gcs    atomic.Int32
	keep   atomic.Int32
	refs   []string
}

func (c *scriptedCore) Run(ctx context.Context, req sandbox.Request) (*report.Run, error) {
	var in string
	if req.Stdin != nil {
		b, _ := io.ReadAll(req.Stdin)
		in = string(b)
	}
	c.mu.Lock()
	c.reqs = append(c.reqs, req)
	c.stdins = append(c.stdins, in)
	run := c.run
	c.mu.Unlock()
	if run == nil {
		code := 0
		return &report.Run{OK: true, VMID: "vm-test", Outcome: report.Outcome{ExitCode: &code, Stdout: "hi\n"}, Path: "cold"}, nil
	}
	return run(ctx, req)
}

func (c *scriptedCore) requests() []sandbox.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs)
}

func (c *scriptedCore) StageList(context.Context) (*stages.StageListResult, error) {
	return &stages.StageListResult{OK: true, Stages: []stages.StageEntry{}}, nil
}

func (c *scriptedCore) StageInfo(_ context.Context, ref string) (*stages.StageInfoResult, error) {
	c.mu.Lock()
	c.refs = append(c.refs, ref)
	c.mu.Unlock()
	return nil, fmt.Errorf("stage %q: %w", ref, errdefs.ErrNotFound)
}

func (c *scriptedCore) StageRemove(_ context.Context, ref string) (*stages.StageRemoveResult, error) {
	return &stages.StageRemoveResult{OK: true, Removed: "abc", Label: ref}, nil
}

func (c *scriptedCore) VMList(context.Context) (*vmrecord.VMListResult, error) {
	return &vmrecord.VMListResult{OK: true, VMs: []vmrecord.VMEntry{}}, nil
}

func (c *scriptedCore) VMGC(_ context.Context, keep int) (*report.VMGC, error) {
	c.gcs.Add(1)
	c.keep.Store(int32(keep))
	return &report.VMGC{OK: true, Removed: []string{}, KilledVMMs: []int{}}, nil
}

func (c *scriptedCore) ImageList(context.Context) (*stages.ImageListResult, error) {
	if c.images == nil {
		return nil, errdefs.ErrNotSupported
	}
	return c.images, nil
}

// session is a client connected in memory to a Server.
type session struct {
	cs       *mcp.ClientSession
	srv      *Server
	progress chan *mcp.ProgressNotificationParams
	wire     *wireLog // what the server wrote, in order
}

func connect(t *testing.T, cfg Config) *session {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &session{srv: srv, progress: make(chan *mcp.ProgressNotificationParams, 1000), wire: &wireLog{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			s.progress <- r.Params
		},
	})
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx, recordingTransport{Transport: st, log: s.wire}) }()
	cs, err := client.Connect(context.Background(), ct, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.cs = cs
	t.Cleanup(func() {
		cs.Close()
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return s
}

func (s *session) call(t *testing.T, ctx context.Context, name string, args any, token any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != nil {
		p.SetProgressToken(token)
	}
	res, err := s.cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
