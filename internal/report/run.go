// Package report holds the JSON reports the core gives its front ends:
// a run's report (Run) and its blocks, the outcome of a command (also a
// session exec's), and housekeeping's (VMGC). Plain data: it imports only
// the standard library and the VMM contract's types.
package report

import "isopod/internal/vmm"

// Run is the one JSON object a run produces. Optional fields are omitted
// when their condition does not hold.
type Run struct {
	OK   bool     `json:"ok"`
	VMID string   `json:"vm_id"`
	Name string   `json:"name"`
	Argv []string `json:"argv"`

	Outcome

	ExecMS          int64  `json:"exec_ms"`
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
	Path            string `json:"path"` // "cold" or "warm"
	// ReadyVM: the run was served by a VM restored before the call
	// (a long-lived front end's ready VMs); Path is "warm".
	ReadyVM bool `json:"ready_vm,omitempty"`
	// RootAssembled: the run resumed from a snapshot whose root was
	// already assembled from its stage chain (an assembled snapshot of a
	// recurring shape); its scratch disk is a copy of the snapshot's.
	RootAssembled bool `json:"root_assembled,omitempty"`

	Accel        vmm.Accel `json:"accel"`
	VCPUs        int       `json:"vcpus"`
	MemMiB       int       `json:"mem_mib"`
	ScratchMiB   int       `json:"scratch_mib"`
	RootfsFlavor string    `json:"rootfs_flavor"`
	BaseSHA256   string    `json:"base_sha256"`
	VMM          vmm.Info  `json:"vmm"`

	StageID   string `json:"stage_id,omitempty"`
	StageName string `json:"stage_name,omitempty"`
	// CommitError says why a commit the command earned (exit 0) failed;
	// the report is otherwise complete. Never set with StageID.
	CommitError string `json:"commit_error,omitempty"`
	ForkedFrom  string `json:"forked_from,omitempty"`

	GuestIP string `json:"guest_ip,omitempty"`
	Net     *Net   `json:"net,omitempty"`
	Egress  any    `json:"egress,omitempty"`

	Copied    []Copied   `json:"copied,omitempty"`
	Workspace *Workspace `json:"workspace,omitempty"`
	Warnings  []string   `json:"warnings,omitempty"`

	SerialLogPath string `json:"serial_log_path"`
	StdoutLogPath string `json:"stdout_log_path"`
	StderrLogPath string `json:"stderr_log_path"`
}

// Outcome is how a command ended and what it printed, as a run's report
// and a session's exec report both give it.
type Outcome struct {
	ExitCode *int `json:"exit_code"`
	Signal   *int `json:"signal"`
	TimedOut bool `json:"timed_out"`
	// GuestDied: the guest (kernel or agent) went away before the command
	// ended; the report holds what arrived until then, and the reason
	// read from the end of the guest console.
	GuestDied       bool   `json:"guest_died"`
	GuestDiedReason string `json:"guest_died_reason,omitempty"`

	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
}

// Net summarises a networked run's traffic.
type Net struct {
	Mode      string `json:"mode"` // "nat" or "filtered"
	Flows     int    `json:"flows"`
	Denied    int    `json:"denied"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
	LogPath   string `json:"log_path"`
}

// Copied reports one copied file.
type Copied struct {
	Guest string `json:"guest"`
	Host  string `json:"host"`
	Bytes int64  `json:"bytes"`
}
