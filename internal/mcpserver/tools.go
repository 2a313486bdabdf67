package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/sandbox"
)

// Tool names, as clients see them.
const (
	ToolSandboxRun = "sandbox_run"
	ToolStageList  = "stage_list"
	ToolStageInfo  = "stage_info"
	ToolStageRm    = "stage_rm"
	ToolVMList     = "vm_list"
	ToolVMGC       = "vm_gc"
	ToolImageList  = "image_list"
)

// ToolNames lists every tool the server registers (session_expose only
// on stdio, or where its operator allows it: sessions.go).
var ToolNames = append([]string{ToolSandboxRun, ToolStageList, ToolStageInfo, ToolStageRm, ToolVMList, ToolVMGC, ToolImageList},
	SessionTools...)

// NoArgs is the input of a tool without arguments.
type NoArgs struct{}

// StageRefArgs names one stage.
type StageRefArgs struct {
	Reference string `json:"reference" jsonschema:"the stage: its label (e.g. myproj/deps), its name or its stage_id; or a prefix of one stage's label, or of its stage_id of at least 4 hex digits, with or without st- (st-839ef or 839ef). A prefix that fits several stages is refused, naming them"`
}

// VMGCArgs configures vm_gc.
type VMGCArgs struct {
	KeepLast *int `json:"keep_last,omitempty" jsonschema:"how many of the newest VM records to keep (default 20); 0 keeps none. A VM whose VMM still runs, or whose run is still going, is always kept"`
}

func boolp(b bool) *bool { return &b }

// handler is a tool's work: typed input, typed result.
type handler[In, Out any] func(ctx context.Context, req *mcp.CallToolRequest, in In) (*Out, error)

// addTool registers t with h. The arguments are checked against in, the
// input schema, by checkArgs (after coerce, if any) rather than by the SDK,
// so that refusals are in isopod's words; the result goes back as
// structured content and as the same JSON in a text block.
func addTool[In, Out any](s *Server, t *mcp.Tool, in *jsonschema.Schema, coerce coercion, h handler[In, Out]) {
	if t.InputSchema == nil {
		t.InputSchema = in
	}
	if t.OutputSchema == nil {
		t.OutputSchema = outputSchema[Out]()
	}
	s.mcp.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := s.authorize(t.Name, req); err != nil {
			s.log.Info("tool refused", "tool", t.Name, "err", err)
			return errorResult(err.Error()), nil
		}
		args, err := checkArgs(in, req.Params.Arguments, coerce)
		if err != nil {
			return errorResult(t.Name + " refused: " + err.Error()), nil
		}
		var input In
		if err := json.Unmarshal(args, &input); err != nil {
			return errorResult(t.Name + " refused: the arguments do not fit the tool's schema"), nil
		}
		out, err := h(ctx, req, input)
		if err != nil {
			return errorResult(err.Error()), nil
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("%s: encoding the result: %w", t.Name, err)
		}
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: string(b)}},
			StructuredContent: json.RawMessage(b),
		}, nil
	})
}

func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: shortText(text)}}}
}

// inputSchema infers In's schema.
func inputSchema[In any]() *jsonschema.Schema {
	sc, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: input schema: %v", err))
	}
	return sc
}

// addTools registers every tool.
func (s *Server) addTools() {
	addTool(s, &mcp.Tool{
		Name:        ToolSandboxRun,
		Title:       "Run a command in a fresh microVM",
		Description: runDescription,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(true)},
		// Claude Code honours this: a report can carry two 64 KiB heads.
		Meta:        mcp.Meta{"anthropic/maxResultSizeChars": 100000},
		InputSchema: advertisedRunSchema(runInputSchema(), s.cfg.HostIO),
	}, runInputSchema(), inspectorArgs, s.sandboxRun)

	addTool(s, &mcp.Tool{
		Name:        ToolStageList,
		Title:       "List stages",
		Description: "List every stage (committed filesystem layer), oldest first: stage_id, name, label, parent, chain, base, sizes, created (RFC 3339) and created_unix, and stale (made over another build of its base; rebuild it from stage \"base\").",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, inputSchema[NoArgs](), nil, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*StageListResult, error) {
		res, err := s.cfg.Core.StageList(ctx)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolStageList}, err)
		}
		return stageListResult(res), nil
	})

	addTool(s, &mcp.Tool{
		Name:        ToolStageInfo,
		Title:       "Describe a stage",
		Description: "Describe one stage and its chain (root first, ending with the stage itself) and the layer files it mounts.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, inputSchema[StageRefArgs](), nil, func(ctx context.Context, _ *mcp.CallToolRequest, in StageRefArgs) (*StageInfoResult, error) {
		res, err := s.cfg.Core.StageInfo(ctx, in.Reference)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolStageInfo}, err)
		}
		return stageInfoResult(res), nil
	})

	addTool(s, &mcp.Tool{
		Name:        ToolStageRm,
		Title:       "Remove a stage",
		Description: "Remove a stage. Refused while another stage forks from it: remove the children first (leaf first). Stages are never removed automatically.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: false, OpenWorldHint: boolp(false)},
	}, inputSchema[StageRefArgs](), nil, func(ctx context.Context, _ *mcp.CallToolRequest, in StageRefArgs) (*StageRemoveResult, error) {
		res, err := s.cfg.Core.StageRemove(ctx, in.Reference)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolStageRm}, err)
		}
		return stageRemoveResult(res), nil
	})

	s.addHousekeepingTools()
	s.addSessionTools()
}

// addHousekeepingTools registers vm_list, vm_gc and image_list.
func (s *Server) addHousekeepingTools() {
	addTool(s, &mcp.Tool{
		Name:        ToolVMList,
		Title:       "List VM records",
		Description: "List VM records newest first: vm_id, name, created (RFC 3339) and created_unix, argv, live (its VMM process is still running), dir_bytes, exit_code. Each run leaves a record with its logs until vm_gc prunes it.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, inputSchema[NoArgs](), nil, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*VMListResult, error) {
		res, err := s.cfg.Core.VMList(ctx)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolVMList}, err)
		}
		return vmListResult(res), nil
	})

	gcSchema := inputSchema[VMGCArgs]()
	keep := gcSchema.Properties["keep_last"]
	keep.Type, keep.Types = "integer", nil
	keep.Default = mustJSON(DefaultGCKeepLast)
	keep.Minimum = floatp(0)
	addTool(s, &mcp.Tool{
		Name:        ToolVMGC,
		Title:       "Garbage-collect VM records",
		Description: "Kill orphaned VMM processes and delete all but the newest keep_last VM records (their logs); keep_last 0 keeps none. A VM still running is always kept. The server also does this at start-up and every 20 runs.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: true, OpenWorldHint: boolp(false)},
	}, gcSchema, nil, func(ctx context.Context, _ *mcp.CallToolRequest, in VMGCArgs) (*VMGCResult, error) {
		keepLast := DefaultGCKeepLast
		if in.KeepLast != nil {
			keepLast = *in.KeepLast
		}
		res, err := s.cfg.Core.VMGC(ctx, keepLast)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolVMGC}, err)
		}
		return vmGCResult(res), nil
	})

	addTool(s, &mcp.Tool{
		Name:        ToolImageList,
		Title:       "List bases",
		Description: "List the bases sandbox_run accepts (base-min: busybox only; base-debian: python3/pip, node/npm, git, gcc, make, curl), each with built, stale (built for another agent or protocol: rebuild it) and, when not usable, a hint naming the command that builds it.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, inputSchema[NoArgs](), nil, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*ImageListResult, error) {
		res, err := s.cfg.Core.ImageList(ctx)
		if err != nil {
			return nil, s.toolError(ctx, failure{tool: ToolImageList}, err)
		}
		return imageListResult(res), nil
	})
}

func floatp(v float64) *float64 { return &v }

// runInputSchema is the inferred sandbox_run schema with plain types,
// defaults and bounds, so that a model (and a form-based client such as
// MCP Inspector) sees them without other docs.
func runInputSchema() *jsonschema.Schema {
	sc := inputSchema[RunArgs]()
	set := func(name, typ string, def any, min, max *float64) {
		p := sc.Properties[name]
		if p == nil {
			panic("mcpserver: no property " + name)
		}
		if typ != "" {
			// A nullable Go type infers ["null", typ]; clients then offer
			// null, and some send every value as text.
			p.Type, p.Types = typ, nil
		}
		if def != nil {
			p.Default = mustJSON(def)
		}
		p.Minimum, p.Maximum = min, max
	}
	f := func(v int) *float64 { return floatp(float64(v)) }
	set("stage", "", sandbox.BaseStage, nil, nil)
	// base has no schema default: a fork must keep its chain's base.
	set("network", "boolean", true, nil, nil)
	// Absent and [] differ for these two (NAT against deny-all): no default.
	set("allow_hosts", "array", nil, nil, nil)
	set("allow_cidrs", "array", nil, nil, nil)
	set("copy_out", "array", []CopyOutArg{}, nil, nil)
	set("read_files", "array", nil, nil, nil)
	set("inject", "array", nil, nil, nil)
	set("env", "object", nil, nil, nil)
	set("timeout_s", "", sandbox.DefaultTimeoutS, f(1), f(sandbox.MaxTimeoutS))
	set("vcpus", "", sandbox.DefaultVCPUs, f(1), f(sandbox.MaxVCPUs))
	set("mem_mib", "", sandbox.DefaultMemMiB, f(sandbox.MinMemMiB), f(sandbox.MaxMemMiB))
	set("scratch_mib", "", nil, f(sandbox.MinScratchMiB), f(sandbox.MaxScratchMiB))
	return sc
}

// outputSchema infers T's schema and replaces every unconstrained
// sub-schema (a Go interface field), which would marshal as the boolean
// schema true, with an explicit object: some clients (the TypeScript SDK)
// accept only object schemas for properties.
func outputSchema[T any]() *jsonschema.Schema {
	sc, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: output schema: %v", err))
	}
	var walk func(*jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil {
			return
		}
		for name, p := range s.Properties {
			if reflect.ValueOf(*p).IsZero() {
				s.Properties[name] = &jsonschema.Schema{Description: "any JSON value"}
				continue
			}
			walk(p)
		}
		walk(s.Items)
		walk(s.AdditionalProperties)
	}
	walk(sc)
	if e := sc.Properties["egress"]; e != nil {
		e.Description = "filtered runs only: the egress flight record (what was allowed and denied)"
	}
	return sc
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
