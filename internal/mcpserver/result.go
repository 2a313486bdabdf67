package mcpserver

import (
	"time"

	"isopod/internal/report"
	"isopod/internal/stages"
	"isopod/internal/vmm"
	"isopod/internal/vmrecord"
)

// Every tool result is a projection of a core result written out here, so
// that what MCP clients get is decided in this package: a field the core
// adds does not reach them until it is added here (a test says when the run
// report has drifted). MCP results carry no "ok": a tool error says
// failure. The shapes are the ones docs/mcp-usage.md states.

// RunResult is sandbox_run's result: the run report in the names of the
// MCP contract (docs/mcp-usage.md, "The run report"). It differs from the
// CLI's report (report.Run) in three names only: vm_name for name,
// duration_ms for exec_ms, and no ok.
type RunResult struct {
	VMID   string   `json:"vm_id"`
	VMName string   `json:"vm_name"`
	Argv   []string `json:"argv"`

	report.Outcome

	DurationMS      int64  `json:"duration_ms"`
	BootMS          *int64 `json:"boot_ms,omitempty"`
	ResumeMS        *int64 `json:"resume_ms,omitempty"`
	TeardownMS      int64  `json:"teardown_ms"`
	CopyOutMS       *int64 `json:"copy_out_ms,omitempty"`
	CommitMS        *int64 `json:"commit_ms,omitempty"`
	CommitHashMS    *int64 `json:"commit_hash_ms,omitempty"`
	CommitCopyMS    *int64 `json:"commit_copy_ms,omitempty"`
	SnapshotBuilt   bool   `json:"snapshot_built"`
	SnapshotBuildMS *int64 `json:"snapshot_build_ms,omitempty"`
	TotalMS         int64  `json:"total_ms"`
	Path            string `json:"path"`

	Accel        vmm.Accel `json:"accel"`
	VCPUs        int       `json:"vcpus"`
	MemMiB       int       `json:"mem_mib"`
	ScratchMiB   int       `json:"scratch_mib"`
	RootfsFlavor string    `json:"rootfs_flavor"`
	BaseSHA256   string    `json:"base_sha256"`
	VMM          vmm.Info  `json:"vmm"`

	StageID     string `json:"stage_id,omitempty"`
	StageName   string `json:"stage_name,omitempty"`
	CommitError string `json:"commit_error,omitempty"`
	ForkedFrom  string `json:"forked_from,omitempty"`

	GuestIP string      `json:"guest_ip,omitempty"`
	Net     *report.Net `json:"net,omitempty"`
	Egress  any         `json:"egress,omitempty"`

	Copied    []report.Copied   `json:"copied,omitempty"`
	Workspace *report.Workspace `json:"workspace,omitempty"`
	ReadyVM   bool              `json:"ready_vm,omitempty"`
	// RootAssembled: resumed from a snapshot with the run's root assembled.
	RootAssembled bool     `json:"root_assembled,omitempty"`
	Warnings      []string `json:"warnings,omitempty"`

	SerialLogPath string `json:"serial_log_path"`
	StdoutLogPath string `json:"stdout_log_path"`
	StderrLogPath string `json:"stderr_log_path"`

	// The server's own: what read_files read back, and what the call
	// moved through the stage registry.
	Files    []FileResult    `json:"files,omitempty"`
	Registry *RegistryResult `json:"registry,omitempty"`
}

// runResult projects a core report. Warnings are said in the MCP
// server's words (mcpWords).
func runResult(r *report.Run) *RunResult {
	out := &RunResult{
		VMID: r.VMID, VMName: r.Name, Argv: r.Argv,
		Outcome:    r.Outcome,
		DurationMS: r.ExecMS, BootMS: r.BootMS, ResumeMS: r.ResumeMS, TeardownMS: r.TeardownMS,
		CopyOutMS: r.CopyOutMS, CommitMS: r.CommitMS, CommitHashMS: r.CommitHashMS, CommitCopyMS: r.CommitCopyMS,
		SnapshotBuilt: r.SnapshotBuilt, SnapshotBuildMS: r.SnapshotBuildMS, TotalMS: r.TotalMS, Path: r.Path,
		Accel: r.Accel, VCPUs: r.VCPUs, MemMiB: r.MemMiB, ScratchMiB: r.ScratchMiB,
		RootfsFlavor: r.RootfsFlavor, BaseSHA256: r.BaseSHA256, VMM: r.VMM,
		StageID: r.StageID, StageName: r.StageName, CommitError: mcpWords.Replace(r.CommitError), ForkedFrom: r.ForkedFrom,
		GuestIP: r.GuestIP, Net: r.Net, Egress: r.Egress,
		Copied: r.Copied, Workspace: r.Workspace, ReadyVM: r.ReadyVM, RootAssembled: r.RootAssembled,
		SerialLogPath: r.SerialLogPath, StdoutLogPath: r.StdoutLogPath, StderrLogPath: r.StderrLogPath,
	}
	if out.Argv == nil {
		out.Argv = []string{}
	}
	for _, w := range r.Warnings {
		out.Warnings = append(out.Warnings, mcpWords.Replace(w))
	}
	return out
}

// StageEntry is one stage in stage_list and stage_info: the core's entry
// (created in RFC 3339) with created_unix, the same instant in seconds.
type StageEntry struct {
	stages.StageEntry
	CreatedUnix int64 `json:"created_unix"`
}

func stageEntries(in []stages.StageEntry) []StageEntry {
	out := make([]StageEntry, 0, len(in))
	for _, e := range in {
		out = append(out, StageEntry{StageEntry: e, CreatedUnix: unixOf(e.Created)})
	}
	return out
}

// StageListResult is stage_list's result.
type StageListResult struct {
	Stages []StageEntry `json:"stages"`
}

// StageInfoResult is stage_info's result.
type StageInfoResult struct {
	Stage      StageEntry   `json:"stage"`
	Chain      []StageEntry `json:"chain"`
	LayerPaths []string     `json:"layer_paths"`
}

// StageRemoveResult is stage_rm's result.
type StageRemoveResult struct {
	Removed string `json:"removed"`
	Label   string `json:"label"`
	Name    string `json:"name"`
}

// VMEntry is one VM record in vm_list: the core's entry (created in
// RFC 3339) with created_unix. live is true only while its VMM runs.
type VMEntry struct {
	vmrecord.VMEntry
	CreatedUnix int64 `json:"created_unix"`
}

// VMListResult is vm_list's result.
type VMListResult struct {
	VMs []VMEntry `json:"vms"`
}

// VMGCResult is vm_gc's result.
type VMGCResult struct {
	Removed          []string `json:"removed"`
	Kept             int      `json:"kept"`
	KilledVMMs       []int    `json:"killed_vmm_pids"`
	FreedBytes       int64    `json:"freed_bytes"`
	StageLeftovers   []string `json:"stage_leftovers_removed,omitempty"`
	SnapshotsRemoved []string `json:"snapshots_removed,omitempty"`
	BuildLeftovers   []string `json:"build_leftovers_removed,omitempty"`
}

// ImageListResult is image_list's result.
type ImageListResult struct {
	Images   []stages.ImageEntry `json:"images"`
	Warnings []string            `json:"warnings,omitempty"`
}

func stageListResult(r *stages.StageListResult) *StageListResult {
	return &StageListResult{Stages: stageEntries(r.Stages)}
}

func stageInfoResult(r *stages.StageInfoResult) *StageInfoResult {
	return &StageInfoResult{
		Stage:      StageEntry{StageEntry: r.Stage, CreatedUnix: unixOf(r.Stage.Created)},
		Chain:      stageEntries(r.Chain),
		LayerPaths: nonNil(r.LayerPaths),
	}
}

func stageRemoveResult(r *stages.StageRemoveResult) *StageRemoveResult {
	return &StageRemoveResult{Removed: r.Removed, Label: r.Label, Name: r.Name}
}

func vmListResult(r *vmrecord.VMListResult) *VMListResult {
	out := &VMListResult{VMs: make([]VMEntry, 0, len(r.VMs))}
	for _, v := range r.VMs {
		out.VMs = append(out.VMs, VMEntry{VMEntry: v, CreatedUnix: unixOf(v.Created)})
	}
	return out
}

func vmGCResult(r *report.VMGC) *VMGCResult {
	return &VMGCResult{
		Removed: nonNil(r.Removed), Kept: r.Kept, KilledVMMs: nonNilInts(r.KilledVMMs), FreedBytes: r.FreedBytes,
		StageLeftovers: r.StageLeftovers, SnapshotsRemoved: r.SnapshotsRemoved, BuildLeftovers: r.BuildLeftovers,
	}
}

func imageListResult(r *stages.ImageListResult) *ImageListResult {
	out := &ImageListResult{Images: r.Images}
	if out.Images == nil {
		out.Images = []stages.ImageEntry{}
	}
	for _, w := range r.Warnings {
		out.Warnings = append(out.Warnings, mcpWords.Replace(w))
	}
	return out
}

// unixOf reads an RFC 3339 time as Unix seconds (0 if it is not one).
func unixOf(rfc3339 string) int64 {
	t, err := time.Parse(time.RFC3339, rfc3339)
	if err != nil {
		return 0
	}
	return t.Unix()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilInts(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}
