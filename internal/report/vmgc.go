package report

// VMGC is what `isopod vm gc` removed and kept.
type VMGC struct {
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
	// SessionsRemoved are the directories of sessions that are over:
	// stopped, or lost with their supervisor (its VMM went with it).
	SessionsRemoved []string `json:"sessions_removed,omitempty"`
}
