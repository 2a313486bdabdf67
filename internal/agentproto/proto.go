// Package agentproto is the wire contract between the isopod host and the
// guest agent. It imports only the standard library and is compiled into both.
//
// # Transport
//
// One byte stream (a virtio-serial port in the guest, a socket on the host)
// carries frames. Every frame is
//
//	u32 LE  total length of what follows (header length field + header + payload)
//	u32 LE  header length
//	header  JSON encoding of [Msg]
//	payload raw bytes (output, stdin, file data, entropy); may be empty
//
// A frame is at most [MaxFrame] bytes; both sides refuse larger ones.
//
// # Multiplexing
//
// Every request carries an ID chosen by the host (non-zero, unique per
// connection). Every frame the guest sends about that request carries the
// same ID, so several requests (an exec and a ping, two execs) can be in
// flight at once. ID 0 is reserved for the guest's unsolicited [KindHello]
// sent when the agent first opens its port.
//
// # Handshake
//
// After a cold boot the guest sends Hello (ID 0) as soon as it is ready. The
// host may also send Hello at any time (after a snapshot resume it must) and
// gets Hello back. The host refuses a guest whose Version differs from
// [Version].
//
// # Flow control
//
// Stdin is credit-based: the host keeps at most [StdinWindow] unacknowledged
// [KindStdin] frames per exec; the guest answers each with [KindStdinAck]
// once the bytes are written to the process. Guest-to-host data is not
// windowed: the host must keep reading and buffer per request, except a
// copy-in ([KindPutFile]), whose chunks the guest acknowledges one by one
// with [KindFileAck] within [PutWindow].
//
// # Sessions
//
// By default an exec is one-shot: when its process exits the guest kills
// what is left of its process group and cgroup, and when the connection
// ends it kills every exec still running. A VM kept across many calls
// changes that in three ways:
//
//   - [KindSession], sent by the host after a handshake, marks the
//     connection: when it ends, its running execs are left to finish (or
//     time out) and the agent serves the port again, greeting the next
//     connection with Hello. Send it again after each reconnect.
//   - Exec.Keep leaves the processes the command started running after it
//     exits. Its output ends when the process exits: the guest reads what
//     is in the pipes for at most a short grace, then discards what
//     processes left behind still write, so that a daemon holding the
//     pipes neither blocks the exec nor dies of a broken pipe. The timeout
//     still kills the command's process group and cgroup while it runs.
//   - Exec.Detach starts a background job: the guest answers at once with
//     [KindJob] (a job id such as "j1") and keeps the job's output in
//     buffers of [JobBuffer] bytes per stream, dropping the oldest unread
//     bytes when one fills (JobInfo counts them). [KindJobRead] returns
//     what arrived since the last read, [KindJobWait] first waits for the
//     job to exit (at most WaitMS), [KindJobKill] signals its process
//     group, [KindJobList] lists jobs. Jobs live in the agent, so they
//     outlive connections and a pause.
//
// [KindPutFile] copies a file in: the host sends [KindFileChunk] frames
// (in order; the last carries EOF, or Abort to give up), the guest writes
// them to a temporary file beside the destination, acknowledges each with
// [KindFileAck] and, after EOF, renames it onto the destination and
// answers [KindFileDone]; on any failure it removes the temporary file and
// answers [KindError].
//
// [KindPortOpen] relays a TCP connection to 127.0.0.1:Port in the guest
// over the agent channel, so it works without any network: the guest
// dials, answers OK (or an error), and both sides then send
// [KindPortData] frames, each acknowledged with [KindPortAck] once
// written to its socket; a side keeps at most [PortWindow] unacknowledged,
// so one slow stream never holds up the channel. [KindPortClose] with EOF
// is a half-close (no more data from its sender); without it the stream
// is over both ways. A stream ends with its connection.
//
// [KindFreeze] freezes the root's writable layer (the scratch filesystem:
// its dirty data and journal are written out and further writes block) so
// that the host can copy the scratch disk's image while the VM runs, and
// [KindThaw] lets writes go on. A freeze is bounded: the guest thaws on
// its own after FreezeMS (at most [MaxFreezeMS]) or when the connection
// that froze it ends, whichever comes first, so that a host that fails
// never leaves the guest's writes blocked. A thaw that finds the freeze
// already ended that way is refused (the copy may be torn); one freeze is
// held at a time.
//
// This wire surface is unstable: it changes with [Version] and both ends are
// always built from one tree.
package agentproto

// Version is the protocol version. Bump it on any incompatible change; the
// host refuses a guest that disagrees and tells the user to rebuild images.
const Version = 6

// Limits.
const (
	// MaxFrame caps one frame (length fields, header and payload).
	MaxFrame = 1 << 20
	// MaxHeader caps the JSON header of one frame.
	MaxHeader = 64 << 10
	// ChunkSize is the largest payload either side puts in one data frame.
	ChunkSize = 32 << 10
	// StdinWindow is how many unacknowledged stdin frames the host may have
	// outstanding for one exec.
	StdinWindow = 8
	// MaxHostname caps SetHostname (the kernel's limit).
	MaxHostname = 64
	// DefaultFreezeMS bounds a freeze whose FreezeMS is 0; MaxFreezeMS
	// caps FreezeMS.
	DefaultFreezeMS = 30_000
	MaxFreezeMS     = 120_000
)

// Kind names a message.
type Kind string

const (
	// Handshake and liveness.
	KindHello Kind = "hello" // both directions; guest reply fills Hello
	KindPing  Kind = "ping"  // host -> guest
	KindPong  Kind = "pong"  // guest -> host

	// Exec.
	KindExec     Kind = "exec"      // host -> guest: Exec set; starts a process
	KindStdin    Kind = "stdin"     // host -> guest: payload is stdin bytes; EOF closes
	KindStdinAck Kind = "stdin_ack" // guest -> host: one stdin frame consumed
	KindOutput   Kind = "output"    // guest -> host: Stream set; payload is output
	KindExecDone Kind = "exec_done" // guest -> host: Done set; last frame of an exec
	KindSignal   Kind = "signal"    // host -> guest: Signal set; to the exec's process group

	// Sessions and background jobs (see Sessions above).
	KindSession Kind = "session"  // host -> guest: keep this connection's execs when it ends; OK
	KindJob     Kind = "job"      // guest -> host: JobInfo set; payload is the stdout then the stderr bytes it counts
	KindJobRead Kind = "job_read" // host -> guest: Job, MaxBytes (per stream; 0: JobReadMax); KindJob
	KindJobWait Kind = "job_wait" // host -> guest: Job, WaitMS, MaxBytes; KindJob once exited or after WaitMS
	KindJobKill Kind = "job_kill" // host -> guest: Job, Signal; to the job's process group; OK
	KindJobList Kind = "job_list" // both: the guest's reply sets Jobs
	KindPutFile Kind = "put_file" // host -> guest: Path, MaxBytes, Put; KindFileChunk frames follow
	KindFileAck Kind = "file_ack" // guest -> host: one put_file chunk written

	// Port relay (see Sessions above): frames carry the port_open's ID.
	KindPortOpen  Kind = "port_open"  // host -> guest: Port; OK once connected
	KindPortData  Kind = "port_data"  // both: payload is stream bytes
	KindPortAck   Kind = "port_ack"   // both: one port_data frame written to the socket
	KindPortClose Kind = "port_close" // both: EOF set: half-close; else the stream is over

	// Files. A copy-out sends only the file's data: holes (and runs of
	// zeros) are left out, so a sparse file stays sparse and costs nothing
	// to copy. Each chunk says where its bytes belong.
	KindCopyOut   Kind = "copy_out"   // host -> guest: Path, MaxBytes (file size), MaxData (bytes sent)
	KindFileChunk Kind = "file_chunk" // guest -> host (host -> guest on put_file): payload is file bytes at Offset
	KindFileDone  Kind = "file_done"  // guest -> host: File set; the file is complete

	// The root filesystem. The guest boots with only its base image
	// mounted; the host then names the disks that make the run's root, so
	// that a snapshot taken before that serves any chain of layers, a
	// fresh scratch disk and a workspace, each attached at restore.
	KindMount            Kind = "mount"             // host -> guest: Mount set; assemble the root, once
	KindWorkspaceChanges Kind = "workspace_changes" // host -> guest: list what changed in the workspace
	KindWorkspaceEntry   Kind = "workspace_entry"   // guest -> host: Entry set; one changed path

	// Machine configuration.
	KindConfigureNet Kind = "configure_net" // host -> guest: Net set
	KindSyncClock    Kind = "sync_clock"    // host -> guest: Clock set
	KindSetHostname  Kind = "set_hostname"  // host -> guest: Hostname set
	KindAddEntropy   Kind = "add_entropy"   // host -> guest: payload is random bytes; reseed
	KindSetBootID    Kind = "set_boot_id"   // host -> guest: BootID set; /proc/sys/kernel/random/boot_id reads it from now on (a fork)
	KindHalt         Kind = "halt"          // host -> guest: sync disks and power off
	KindFreeze       Kind = "freeze"        // host -> guest: FreezeMS; freeze the scratch filesystem; OK
	KindThaw         Kind = "thaw"          // host -> guest: end the freeze this connection holds; OK
	KindSettle       Kind = "settle"        // host -> guest: OK once finished commands are cleaned up and the next one's process is made (before a snapshot)

	// Generic replies.
	KindOK    Kind = "ok"    // guest -> host: request done
	KindError Kind = "error" // guest -> host: Error set; request failed, nothing more follows
)

// Msg is the JSON header of one frame. Only the fields of its Kind are set.
type Msg struct {
	ID   uint64 `json:"id"`
	Kind Kind   `json:"kind"`

	Hello  *Hello    `json:"hello,omitempty"`
	Exec   *Exec     `json:"exec,omitempty"`
	Done   *ExecDone `json:"done,omitempty"`
	Stream string    `json:"stream,omitempty"` // "stdout" or "stderr" on KindOutput
	EOF    bool      `json:"eof,omitempty"`    // on KindStdin, a put's KindFileChunk, KindPortClose: no more input
	Signal int       `json:"signal,omitempty"` // on KindSignal

	Path     string    `json:"path,omitempty"`      // on KindCopyOut
	MaxBytes int64     `json:"max_bytes,omitempty"` // on KindCopyOut: the largest file size accepted
	MaxData  *int64    `json:"max_data,omitempty"`  // on KindCopyOut: the most data bytes to send; absent: no limit
	Offset   int64     `json:"offset,omitempty"`    // on KindFileChunk: where the payload belongs
	File     *FileDone `json:"file,omitempty"`
	Abort    bool      `json:"abort,omitempty"` // on a put_file's KindFileChunk: give up, remove the temporary file
	Put      *PutFile  `json:"put,omitempty"`

	Job     string    `json:"job,omitempty"`      // a job id, on the job requests
	JobInfo *JobInfo  `json:"job_info,omitempty"` // on KindJob
	Jobs    []JobInfo `json:"jobs,omitempty"`     // on KindJobList from the guest
	WaitMS  int64     `json:"wait_ms,omitempty"`  // on KindJobWait
	Port    int       `json:"port,omitempty"`     // on KindPortOpen

	Mount    *Mount          `json:"mount,omitempty"`
	Entry    *WorkspaceEntry `json:"entry,omitempty"`
	Net      *NetConfig      `json:"net,omitempty"`
	Clock    *Clock          `json:"clock,omitempty"`
	Hostname string          `json:"hostname,omitempty"`
	BootID   string          `json:"boot_id,omitempty"`   // on KindSetBootID: a UUID, lowercase
	Sync     bool            `json:"sync,omitempty"`      // on KindHalt
	FreezeMS int64           `json:"freeze_ms,omitempty"` // on KindFreeze: thaw on its own after this long (0: DefaultFreezeMS)

	Error string `json:"error,omitempty"`
	// Class is the class of a KindError's failure, named as the host's
	// error classes are (invalid_argument, not_found, failed_precondition,
	// ...), so that the host can tell a caller's mistake from its own;
	// absent for a failure of the agent itself.
	Class string `json:"class,omitempty"`
}

// Hello is the handshake body.
type Hello struct {
	Version      int     `json:"version"`
	AgentVersion string  `json:"agent_version,omitempty"`
	UptimeMS     int64   `json:"uptime_ms,omitempty"`
	BootError    string  `json:"boot_error,omitempty"` // set when the root could not be assembled
	Kernel       string  `json:"kernel,omitempty"`
	ModulesMS    float64 `json:"modules_ms,omitempty"`
	// LastID, on a reply to the host's KindHello, is the highest request
	// id the agent has read on this stream. A guest resumed from a
	// snapshot may still hold execs, copy-ins and relayed streams under
	// the ids of the host that made the snapshot; a new host numbers its
	// requests above LastID so that none collides with them.
	LastID uint64 `json:"last_id,omitempty"`
}

// MaxLastID bounds Hello.LastID: a host refuses a guest that claims more,
// which would leave it no ids to use.
const MaxLastID = 1 << 53

// Exec starts one process.
type Exec struct {
	Argv      []string `json:"argv"`
	Env       []string `json:"env,omitempty"` // KEY=VALUE, applied over the baseline
	Cwd       string   `json:"cwd,omitempty"` // default /root
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"` // KindStdin frames follow; else /dev/null
	// Keep leaves what the process started running when it exits (see
	// Sessions).
	Keep bool `json:"keep,omitempty"`
	// Detach starts a background job, answered by KindJob at once; it
	// implies Keep and refuses Stdin.
	Detach bool `json:"detach,omitempty"`
}

// ExecDone reports how a process ended.
type ExecDone struct {
	ExitCode   *int  `json:"exit_code"` // nil when killed by a signal
	Signal     *int  `json:"signal"`
	TimedOut   bool  `json:"timed_out"`
	DurationMS int64 `json:"duration_ms"`
}

// FileDone closes a copy-out stream.
type FileDone struct {
	Bytes int64  `json:"bytes"` // the file's size
	Data  int64  `json:"data"`  // the bytes sent (the rest are holes or zeros)
	Mode  uint32 `json:"mode"`  // permission bits of the guest file
}

// NetConfig addresses the guest's one NIC.
type NetConfig struct {
	Interface string   `json:"interface,omitempty"` // default eth0
	Address   string   `json:"address"`             // CIDR, e.g. 10.0.2.2/30
	Gateway   string   `json:"gateway,omitempty"`
	DNS       []string `json:"dns,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	// Env is added to every later exec (proxy variables on filtered runs).
	Env []string `json:"env,omitempty"`
}

// Clock carries the host's wall clock.
type Clock struct {
	UnixNano int64 `json:"unix_nano"`
}

// Mount says which disks (found by their serials, see guest.go) make the
// run's root: stage layers l0 .. l(Layers-1) over the base, the scratch
// disk as the upper layer (else a tmpfs in guest memory), and a workspace.
type Mount struct {
	Layers  int  `json:"layers"`
	Scratch bool `json:"scratch"`
	// Flush drops any sectors the guest cached of each disk before it is
	// mounted: after a snapshot resume the disks behind the serials are
	// new files.
	Flush bool `json:"flush,omitempty"`
	// Workspace, when set, is the guest directory where the workspace
	// disk (a squashfs of the host tree) is mounted, writable through the
	// workspace upper disk; it is never part of the root's upper layer.
	Workspace string `json:"workspace,omitempty"`
	// WaitMS bounds the wait for the disks to appear.
	WaitMS int64 `json:"wait_ms,omitempty"`
	// Prefetch, when above 0, has the guest look up that many entries (at
	// most MaxPrefetch) of the stage layers' trees, breadth first, through
	// the assembled root, reading their metadata into its caches: what an
	// assembled snapshot's VM does so that its clones find them there.
	Prefetch int `json:"prefetch,omitempty"`
}

// MaxPrefetch bounds Mount.Prefetch.
const MaxPrefetch = 65536

// WorkspaceEntry is one path that differs in the workspace after a
// command, as its writable layer records it. Path is relative to the
// workspace, clean and never outside it.
type WorkspaceEntry struct {
	Path string `json:"path"`
	// Kind: "file", "dir", "symlink", "deleted" (a path of the original
	// tree that is gone) or "opaque" (a directory whose original contents
	// are all gone, but for the entries listed under it).
	Kind   string `json:"kind"`
	Mode   uint32 `json:"mode,omitempty"` // permission bits
	Size   int64  `json:"size,omitempty"`
	Target string `json:"target,omitempty"` // a symlink's target
	// InOriginal says the path exists in the original tree (so a file is
	// modified, not added).
	InOriginal bool `json:"in_original,omitempty"`
}
