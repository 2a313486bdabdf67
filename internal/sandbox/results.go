package sandbox

// Result types of the Service's housekeeping calls. Each is the JSON object
// the CLI prints and the MCP server returns; OK is always first.

// StageEntry describes one stage.
type StageEntry struct {
	ID         string   `json:"stage_id"`
	Name       string   `json:"name"`
	Label      string   `json:"label"`
	Parent     string   `json:"parent,omitempty"`
	Chain      []string `json:"chain"`
	BaseFlavor string   `json:"base"`
	BaseSHA256 string   `json:"base_sha256,omitempty"`
	SizeBytes  int64    `json:"size_bytes"`
	Allocated  int64    `json:"allocated_bytes"`
	Created    string   `json:"created"`
	Argv       []string `json:"argv,omitempty"`
	// Stale is set when the stage's chain was made over another build of
	// its base than the one installed now.
	Stale bool `json:"stale"`
}

type StageListResult struct {
	OK     bool         `json:"ok"`
	Stages []StageEntry `json:"stages"`
}

type StageInfoResult struct {
	OK         bool         `json:"ok"`
	Stage      StageEntry   `json:"stage"`
	Chain      []StageEntry `json:"chain"`       // root first, ending with Stage
	LayerPaths []string     `json:"layer_paths"` // root first
}

type StageRemoveResult struct {
	OK      bool   `json:"ok"`
	Removed string `json:"removed"`
	Label   string `json:"label"`
	Name    string `json:"name"`
}

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

// ImageEntry describes one base a run accepts.
type ImageEntry struct {
	Flavor        string `json:"base"`
	Built         bool   `json:"built"`
	Stale         bool   `json:"stale"`
	StaleReason   string `json:"stale_reason,omitempty"`
	Path          string `json:"path,omitempty"`
	SizeBytes     int64  `json:"size_bytes,omitempty"`
	ContentSHA256 string `json:"sha256,omitempty"`
	Protocol      int    `json:"protocol_version,omitempty"`
	Hint          string `json:"hint,omitempty"` // how to build it when not built
	// Kind is built (base-min, base-debian), imported (from a container
	// image: Source, Digest) or pulled (a build that came with a stage).
	Kind   string `json:"kind,omitempty"`
	Source string `json:"source,omitempty"`
	Digest string `json:"digest,omitempty"`
}

type ImageListResult struct {
	OK       bool         `json:"ok"`
	Images   []ImageEntry `json:"images"`
	Warnings []string     `json:"warnings,omitempty"`
}
