package agentproto

import (
	"strings"
	"unicode/utf8"
)

// Session limits (see Sessions in the package comment).
const (
	// JobBuffer is how many unread bytes the guest keeps per stream of a
	// background job; older unread bytes are dropped and counted.
	JobBuffer = 1 << 20
	// JobReadMax caps the bytes of one stream that one KindJob reply
	// carries, so that both streams fit one frame.
	JobReadMax = 256 << 10
	// MaxJobs is how many jobs the guest remembers; starting one more
	// forgets the oldest exited job, or is refused when all run. With
	// JobBuffer it bounds the memory the agent keeps for job output
	// (about 2.5 MiB a job at most).
	MaxJobs = 16
	// MaxJobWaitMS caps JobWait's WaitMS.
	MaxJobWaitMS = 10 * 60 * 1000
	// PutWindow is how many unacknowledged put_file chunks the host may
	// have outstanding.
	PutWindow = 8
	// PortWindow is how many unacknowledged port_data frames each side of
	// a relayed stream may have outstanding.
	PortWindow = 16
	// jobNameMax caps JobInfo.Name.
	jobNameMax = 256
)

// Job states.
const (
	JobRunning = "running"
	JobExited  = "exited"
)

// JobInfo describes a background job, and on KindJob the output its
// frame carries.
type JobInfo struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"` // its argv, joined and cut to a few hundred bytes
	State string `json:"state"`          // JobRunning or JobExited
	Pid   int    `json:"pid,omitempty"`
	// ExitCode and Signal are set once exited: one of them, as in
	// ExecDone; a program that could not start exits with 127.
	ExitCode   *int  `json:"exit_code,omitempty"`
	Signal     *int  `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`
	DurationMS int64 `json:"duration_ms"` // so far while it runs
	// Stdout and Stderr are how many bytes of each stream the payload
	// holds, stdout first.
	Stdout int `json:"stdout,omitempty"`
	Stderr int `json:"stderr,omitempty"`
	// StdoutDropped and StderrDropped are the unread bytes dropped since
	// the previous read because the buffer was full: they came before
	// this frame's bytes.
	StdoutDropped int64 `json:"stdout_dropped,omitempty"`
	StderrDropped int64 `json:"stderr_dropped,omitempty"`
	// More says unread output is left beyond what this frame carries.
	More bool `json:"more,omitempty"`
}

// JobName is a job's Name for argv: its words joined by spaces, cut so
// that it takes at most jobNameMax bytes in a header (EncodedLen).
func JobName(argv []string) string {
	var b strings.Builder
	room := jobNameMax - EncodedLen("")
	for i, a := range argv {
		if i > 0 {
			a = " " + a
		}
		for j, w := 0, 0; j < len(a); j += w {
			_, w = utf8.DecodeRuneInString(a[j:])
			n := EncodedLen(a[j:j+w]) - EncodedLen("")
			if room < n {
				return b.String()
			}
			room -= n
			b.WriteString(a[j : j+w])
		}
	}
	return b.String()
}

// PutFile is a copy-in's body.
type PutFile struct {
	// Mode is the new file's permission bits (0: 0644).
	Mode uint32 `json:"mode,omitempty"`
}
