package sandbox

// Result types of the Service's housekeeping calls. Each is the JSON object
// the CLI prints and the MCP server returns; OK is always first.

// VMEntry describes one VM record.
type VMEntry struct {
	ID       string   `json:"vm_id"`
	Name     string   `json:"name"`
	Created  string   `json:"created"`
	Argv     []string `json:"argv,omitempty"`
	Live     bool     `json:"live"`
	DirBytes int64    `json:"dir_bytes"`
	ExitCode *int     `json:"exit_code,omitempty"`
}

type VMListResult struct {
	OK  bool      `json:"ok"`
	VMs []VMEntry `json:"vms"`
}

type VMGCResult struct {
	OK             bool     `json:"ok"`
	Removed        []string `json:"removed"`
	Kept           int      `json:"kept"`
	KilledVMMs     []int    `json:"killed_vmm_pids"`
	FreedBytes     int64    `json:"freed_bytes"`
	StageLeftovers []string `json:"stage_leftovers_removed,omitempty"`
	// SnapshotsRemoved are warm-pool snapshots no current run can use.
	SnapshotsRemoved []string `json:"snapshots_removed,omitempty"`
	// BuildLeftovers are what interrupted kernel fetches and image builds
	// left in kernels/ and images/.
	BuildLeftovers []string `json:"build_leftovers_removed,omitempty"`
}
