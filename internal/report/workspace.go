package report

// Workspace is a report's workspace block.
type Workspace struct {
	Host  string `json:"host"`
	Guest string `json:"guest"`
	// Git: the copy took what git would see, and .git.
	Git   bool  `json:"git"`
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
	// Skipped counts what the copy left out by kind (socket, fifo,
	// device, unreadable).
	Skipped map[string]int `json:"skipped,omitempty"`
	// CredentialsRemoved names the git settings, include lines and files
	// (included ones, credential stores) removed from the copy (names,
	// never values).
	CredentialsRemoved []string `json:"credentials_removed,omitempty"`
	// Changed and PatchBytes describe the patch written to Out; LeftOut
	// counts changes under .git, which no patch carries.
	Changed *WorkspaceChanged `json:"changed,omitempty"`
	LeftOut int               `json:"left_out,omitempty"`
	// Ignored counts new files the repository ignores, which the patch
	// leaves out (so that it applies over a tree that has them).
	Ignored    int    `json:"ignored,omitempty"`
	PatchBytes *int64 `json:"patch_bytes,omitempty"`
	Out        string `json:"out,omitempty"`
	// PatchError says why no patch was written; the rest of the report
	// stands.
	PatchError string `json:"patch_error,omitempty"`
	InMS       int64  `json:"in_ms"`
	OutMS      *int64 `json:"out_ms,omitempty"`
}

// WorkspaceChanged counts the files and symlinks a patch adds, modifies
// and deletes.
type WorkspaceChanged struct {
	Added    int `json:"added"`
	Modified int `json:"modified"`
	Deleted  int `json:"deleted"`
}
