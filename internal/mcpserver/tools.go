package mcpserver

import (
	"context"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
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

// ToolNames lists every tool the server registers.
var ToolNames = []string{ToolSandboxRun, ToolStageList, ToolStageInfo, ToolStageRm, ToolVMList, ToolVMGC, ToolImageList}

// NoArgs is the input of a tool without arguments.
type NoArgs struct{}

// StageRefArgs names one stage.
type StageRefArgs struct {
	Reference string `json:"reference" jsonschema:"the stage: its label (e.g. myproj/deps), its name, or its stage_id (a unique prefix is enough)"`
}

// VMGCArgs configures vm_gc.
type VMGCArgs struct {
	KeepLast int `json:"keep_last,omitempty" jsonschema:"how many of the newest VM records to keep (default 20); live VMs are always kept"`
}

func boolp(b bool) *bool { return &b }

// addTools registers every tool.
func (s *Server) addTools() error {
	runSchema, err := runInputSchema()
	if err != nil {
		return err
	}
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolSandboxRun,
		Title:        "Run a command in a fresh microVM",
		Description:  runDescription,
		InputSchema:  runSchema,
		OutputSchema: outputSchema[sandbox.Report](),
		Annotations:  &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(true)},
		// Claude Code honours this: a report can carry two 64 KiB heads.
		Meta: mcp.Meta{"anthropic/maxResultSizeChars": 100000},
	}, s.sandboxRun)

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolStageList,
		OutputSchema: outputSchema[sandbox.StageListResult](),
		Title:        "List stages",
		Description:  "List every stage (committed filesystem layer), oldest first: stage_id, name, label, parent, chain, base, sizes, created, and stale (made over another build of its base; rebuild it from stage \"base\").",
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*mcp.CallToolResult, *sandbox.StageListResult, error) {
		res, err := s.cfg.Core.StageList(ctx)
		return nil, res, s.toolError(ctx, ToolStageList, "", err)
	})

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolStageInfo,
		OutputSchema: outputSchema[sandbox.StageInfoResult](),
		Title:        "Describe a stage",
		Description:  "Describe one stage and its chain (root first, ending with the stage itself) and the layer files it mounts.",
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in StageRefArgs) (*mcp.CallToolResult, *sandbox.StageInfoResult, error) {
		res, err := s.cfg.Core.StageInfo(ctx, in.Reference)
		return nil, res, s.toolError(ctx, ToolStageInfo, "", err)
	})

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolStageRm,
		OutputSchema: outputSchema[sandbox.StageRemoveResult](),
		Title:        "Remove a stage",
		Description:  "Remove a stage. Refused while another stage forks from it: remove the children first (leaf first). Stages are never removed automatically.",
		Annotations:  &mcp.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: false, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in StageRefArgs) (*mcp.CallToolResult, *sandbox.StageRemoveResult, error) {
		res, err := s.cfg.Core.StageRemove(ctx, in.Reference)
		return nil, res, s.toolError(ctx, ToolStageRm, "", err)
	})

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolVMList,
		OutputSchema: outputSchema[sandbox.VMListResult](),
		Title:        "List VM records",
		Description:  "List VM records newest first: vm_id, name, created, argv, live (its VMM is still running), dir_bytes, exit_code. Each run leaves a record with its logs until vm_gc prunes it.",
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*mcp.CallToolResult, *sandbox.VMListResult, error) {
		res, err := s.cfg.Core.VMList(ctx)
		return nil, res, s.toolError(ctx, ToolVMList, "", err)
	})

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolVMGC,
		OutputSchema: outputSchema[sandbox.VMGCResult](),
		Title:        "Garbage-collect VM records",
		Description:  "Kill orphaned VMM processes and delete all but the newest keep_last VM records (their logs); live VMs are kept. The server also does this at start-up and every 20 runs.",
		Annotations:  &mcp.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: true, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in VMGCArgs) (*mcp.CallToolResult, *sandbox.VMGCResult, error) {
		keep := in.KeepLast
		if keep < 0 {
			return nil, nil, fmt.Errorf("vm_gc: keep_last=%d is negative; give 0 or more (default 20)", keep)
		}
		if keep == 0 {
			keep = DefaultGCKeepLast
		}
		res, err := s.cfg.Core.VMGC(ctx, keep)
		return nil, res, s.toolError(ctx, ToolVMGC, "", err)
	})

	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolImageList,
		OutputSchema: outputSchema[sandbox.ImageListResult](),
		Title:        "List bases",
		Description:  "List the bases sandbox_run accepts (base-min: busybox only; base-debian: python3/pip, node/npm, git, gcc, make, curl), each with built, stale (built for another agent or protocol: rebuild it) and, when not usable, a hint naming the command that builds it.",
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (*mcp.CallToolResult, *sandbox.ImageListResult, error) {
		res, err := s.cfg.Core.ImageList(ctx)
		return nil, res, s.toolError(ctx, ToolImageList, "", err)
	})
	return nil
}

// toolError turns a core failure into a tool error a model can act on: the
// tool, the error class, the core's message and the fix. base, when set, is
// the base a run asked for; a precondition failure then carries that base's
// build hint from image_list.
func (s *Server) toolError(ctx context.Context, tool, base string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s cancelled: %v; any VM it started has been torn down", tool, err)
	}
	class := errdefs.Class(err)
	fix := fixFor(class)
	if base != "" && (class == "failed_precondition" || class == "not_found") {
		if h := s.baseHint(ctx, base); h != "" {
			fix = h
		}
	}
	s.log.Info("tool failed", "tool", tool, "class", class, "err", err)
	return fmt.Errorf("%s failed (%s): %v. Fix: %s", tool, class, err, fix)
}

// baseHint asks the core how to make base usable, when it is not.
func (s *Server) baseHint(ctx context.Context, base string) string {
	res, err := s.cfg.Core.ImageList(ctx)
	if err != nil || res == nil {
		return ""
	}
	for _, im := range res.Images {
		if im.Flavor != base {
			continue
		}
		if im.Built && !im.Stale {
			return ""
		}
		why := "is not built"
		if im.Built {
			why = "is stale"
			if im.StaleReason != "" {
				why += " (" + im.StaleReason + ")"
			}
		}
		hint := im.Hint
		if hint == "" {
			hint = "build it with the isopod CLI (isopod image ls shows how)"
		}
		return fmt.Sprintf("base %s %s: %s", base, why, hint)
	}
	return fmt.Sprintf("there is no base named %s; image_list shows the bases this host has", base)
}

// fixFor names the generic next step for an error class.
func fixFor(class string) string {
	switch class {
	case "invalid_argument":
		return "correct the argument named above and call again."
	case "not_found":
		return "stage_list shows the stages that exist and image_list the bases; check the name."
	case "already_exists":
		return "that label is taken: choose another commit_as label, or stage_rm the old stage first."
	case "failed_precondition":
		return "the host is not ready for this request; image_list shows which bases are built and how to build them, and a stage made over an older base must be rebuilt from stage \"base\"."
	case "unavailable":
		return "the VM or a resource did not answer in time; retry, raise timeout_s or mem_mib, and read serial_log_path of the VM in vm_list."
	case "not_supported":
		return "this host lacks something isopod needs (named above); it must be fixed on the host, not by a different call."
	}
	return "this is a host-side isopod failure; retry once, and if it persists read the VM's logs (vm_list) or report it to whoever runs this server."
}

// runInputSchema is the inferred sandbox_run schema with defaults and
// bounds added, so a model sees them without other docs.
func runInputSchema() (*jsonschema.Schema, error) {
	sc, err := jsonschema.For[RunArgs](nil)
	if err != nil {
		return nil, fmt.Errorf("mcpserver: sandbox_run schema: %w", err)
	}
	set := func(name string, def any, min, max *float64) {
		p := sc.Properties[name]
		if p == nil {
			panic("mcpserver: no property " + name)
		}
		if def != nil {
			p.Default = mustJSON(def)
		}
		p.Minimum, p.Maximum = min, max
	}
	f := func(v int) *float64 { x := float64(v); return &x }
	set("stage", sandbox.BaseStage, nil, nil)
	// base has no schema default: a fork must keep its chain's base.
	set("network", true, nil, nil)
	set("timeout_s", sandbox.DefaultTimeoutS, f(1), f(sandbox.MaxTimeoutS))
	set("vcpus", sandbox.DefaultVCPUs, f(1), f(sandbox.MaxVCPUs))
	set("mem_mib", sandbox.DefaultMemMiB, f(sandbox.MinMemMiB), f(sandbox.MaxMemMiB))
	set("scratch_mib", nil, f(sandbox.MinScratchMiB), f(sandbox.MaxScratchMiB))
	return sc, nil
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
