package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"isopod/internal/errdefs"
)

// The control socket speaks one JSON Call and one JSON Answer per
// connection. Byte fields travel base64-encoded (encoding/json's []byte).

// Operations of a Call.
const (
	OpPing   = "ping"   // is the VM up: the session's record
	OpExec   = "exec"   // run a command (Detach: start a job)
	OpJob    = "job"    // read, wait for or kill a job
	OpJobs   = "jobs"   // list jobs
	OpPut    = "put"    // copy bytes into a guest file
	OpGet    = "get"    // copy a guest file's bytes out
	OpExpose = "expose" // relay a host port to a guest port
	OpStop   = "stop"   // end the session
	OpPause  = "pause"  // write the VM's memory and state to disk and end its VMM
	OpFork   = "fork"   // snapshot the running VM for a new session (it keeps running)
	OpCommit = "commit" // store the session's filesystem as a stage (it keeps running)
)

// MaxFileBytes caps one put or get through the socket.
const MaxFileBytes = 64 << 20

// maxCall caps a Call's encoded size: a file and its base64.
const maxCall = MaxFileBytes/3*4 + 1<<20

// Call is one request to a supervisor.
type Call struct {
	Op string `json:"op"`

	// exec
	Argv     []string `json:"argv,omitempty"`
	Shell    bool     `json:"shell,omitempty"`
	Env      []string `json:"env,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
	Stdin    []byte   `json:"stdin,omitempty"`
	TimeoutS int      `json:"timeout_s,omitempty"`
	Detach   bool     `json:"detach,omitempty"`

	// job
	Job   string `json:"job,omitempty"`
	WaitS int    `json:"wait_s,omitempty"`
	Kill  bool   `json:"kill,omitempty"`

	// put, get
	Path string `json:"path,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
	Data []byte `json:"data,omitempty"`

	// expose
	GuestPort int `json:"guest_port,omitempty"`
	HostPort  int `json:"host_port,omitempty"`

	// commit: the stage's label; fork: the new session's id
	Label string `json:"label,omitempty"`
	Child string `json:"child,omitempty"`
}

// Reply is the result of the calls that answer a few fields (ok first,
// as every isopod JSON object).
type Reply struct {
	OK        bool   `json:"ok"`
	SessionID string `json:"session_id"`
	JobID     string `json:"job_id,omitempty"`
	Jobs      any    `json:"jobs,omitempty"`
	Path      string `json:"path,omitempty"`
	Bytes     *int64 `json:"bytes,omitempty"`
	GuestPort int    `json:"guest_port,omitempty"`
	HostPort  int    `json:"host_port,omitempty"`
	Address   string `json:"address,omitempty"`
}

// Answer is a supervisor's reply: Result on success, else Error and its
// class (errdefs.Class).
type Answer struct {
	OK     bool            `json:"ok"`
	Error  string          `json:"error,omitempty"`
	Class  string          `json:"class,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Err is the Answer's failure as an error of its class, nil on success.
func (a *Answer) Err() error {
	if a.OK {
		return nil
	}
	if c := errdefs.FromClass(a.Class); c != nil {
		// The supervisor's message ends with its class's text already.
		return fmt.Errorf("%s: %w", strings.TrimSuffix(a.Error, ": "+c.Error()), c)
	}
	return errors.New(a.Error)
}

// Dial sends c to the supervisor at socket and returns its answer's
// result; the call is bounded by ctx. A socket nobody serves is
// unavailable.
func Dial(ctx context.Context, socket string, c Call) (json.RawMessage, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("reaching the session's supervisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(c); err != nil {
		return nil, fmt.Errorf("calling the session's supervisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	var a Answer
	if err := json.NewDecoder(conn).Decode(&a); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the session's supervisor did not answer: %w: %w", ctx.Err(), errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("reading the session's supervisor's answer: %w: %w", err, errdefs.ErrUnavailable)
	}
	if err := a.Err(); err != nil {
		return nil, err
	}
	return a.Result, nil
}

// ReadCall reads one Call from conn, refusing one over the cap.
func ReadCall(conn net.Conn) (Call, error) {
	var c Call
	dec := json.NewDecoder(&limitReader{r: conn, n: maxCall})
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("reading the call: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return c, nil
}

// WriteAnswer answers conn with result or err.
func WriteAnswer(conn net.Conn, result any, err error) error {
	a := Answer{OK: err == nil}
	if err != nil {
		a.Error, a.Class = err.Error(), errdefs.Class(err)
	} else if result != nil {
		b, merr := json.Marshal(result)
		if merr != nil {
			a = Answer{Error: merr.Error(), Class: "internal"}
		}
		a.Result = b
	}
	return json.NewEncoder(conn).Encode(a)
}

type limitReader struct {
	r interface{ Read([]byte) (int, error) }
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("the call is over %d bytes", maxCall)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}
