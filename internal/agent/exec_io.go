package agent

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// execPipes holds both ends of an exec's standard streams. The child's ends
// are closed in the agent right after the fork.
type execPipes struct {
	childIn, childOut, childErr *os.File
	in                          *os.File // write end of stdin; nil for /dev/null
	out, errR                   *os.File // read ends of stdout and stderr
}

func newExecPipes(withStdin bool) (*execPipes, error) {
	p := &execPipes{}
	var err error
	if withStdin {
		p.childIn, p.in, err = os.Pipe()
	} else {
		p.childIn, err = os.Open(os.DevNull)
	}
	if err == nil {
		p.out, p.childOut, err = os.Pipe()
	}
	if err == nil {
		p.errR, p.childErr, err = os.Pipe()
	}
	if err != nil {
		p.closeChildEnds()
		p.closeAll()
		return nil, fmt.Errorf("creating pipes: %w", err)
	}
	return p, nil
}

// sparePipes holds an exec's pipes made ahead, without stdin.
type sparePipes struct{ spare[execPipes] }

// take returns the spare pipes, made fresh when there are none; with
// stdin, the spare's /dev/null gives way to a pipe.
func (s *sparePipes) take(withStdin bool) (*execPipes, error) {
	p := s.spare.take()
	if p == nil {
		return newExecPipes(withStdin)
	}
	if withStdin {
		childIn, in, err := os.Pipe()
		if err != nil {
			p.closeChildEnds()
			p.closeAll()
			return nil, fmt.Errorf("creating pipes: %w", err)
		}
		p.childIn.Close()
		p.childIn, p.in = childIn, in
	}
	return p, nil
}

// refill makes spare pipes when there are none.
func (s *sparePipes) refill() {
	if s.ready() {
		return
	}
	p, err := newExecPipes(false)
	if err != nil {
		return // the next exec makes its own, and says why it cannot
	}
	s.put(p, func(p *execPipes) {
		p.closeChildEnds()
		p.closeAll()
	})
}

// refillSpares makes what the next exec takes when it is not ready: its
// cgroup and its pipes.
func (s *Server) refillSpares() {
	s.opts.Cgroups.refill()
	s.pipes.refill()
}

func (p *execPipes) closeChildEnds() {
	for _, f := range []*os.File{p.childIn, p.childOut, p.childErr} {
		if f != nil {
			f.Close()
		}
	}
}

// closeAll closes the agent's ends; closing twice is harmless.
func (p *execPipes) closeAll() {
	for _, f := range []*os.File{p.in, p.out, p.errR} {
		if f != nil {
			f.Close()
		}
	}
}

// killGroup sends SIGKILL to the process group pgid; a group that is already
// empty is fine.
func killGroup(pgid int) {
	if pgid > 0 {
		_ = signalGroup(pgid, unix.SIGKILL)
	}
}

// signalGroup sends sig to the process group pgid; a group that is already
// gone is not an error.
func signalGroup(pgid int, sig unix.Signal) error {
	if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// pump sends what the process writes on one stream as KindOutput frames of
// at most ChunkSize bytes, until EOF or until the pipe is closed under it.
func (c *conn) pump(id uint64, stream string, r *os.File, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.reply(&agentproto.Msg{ID: id, Kind: agentproto.KindOutput, Stream: stream}, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// feedStdin writes queued stdin frames to the process and acknowledges each
// one once its bytes are written (or dropped because the process no longer
// reads). A frame with EOF closes the pipe. It returns when stop is closed.
func (c *conn) feedStdin(st *execState, w *os.File, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	closed := false
	for {
		select {
		case <-stop:
			return
		case f := <-st.stdin:
			if !closed && len(f.data) > 0 {
				if _, err := w.Write(f.data); err != nil {
					if !errors.Is(err, unix.EPIPE) && !errors.Is(err, os.ErrClosed) {
						c.log.Debug("writing stdin failed", "id", st.id, "err", err)
					}
					closed = true
					w.Close()
				}
			}
			if f.eof && !closed {
				closed = true
				w.Close()
			}
			c.reply(&agentproto.Msg{ID: st.id, Kind: agentproto.KindStdinAck}, nil)
		}
	}
}

// execStreams tracks the goroutines that copy a running exec's streams.
type execStreams struct {
	pumps     sync.WaitGroup // the stdout and stderr pumps
	stopStdin chan struct{}  // closed to stop feeding stdin
	stdinDone chan struct{}  // closed once stdin feeding has stopped

	// A kept exec's: its output pipes, owned by the pumps, and their drain.
	out, errR *os.File
	drain     *keepDrain
}

// startStreams starts pumping stdout and stderr to the host and, when the
// exec has a stdin pipe, feeding it from the exec's queue.
func (c *conn) startStreams(st *execState, p *execPipes) *execStreams {
	s := &execStreams{stopStdin: make(chan struct{}), stdinDone: make(chan struct{})}
	s.pumps.Add(2)
	go c.pump(st.id, "stdout", p.out, &s.pumps)
	go c.pump(st.id, "stderr", p.errR, &s.pumps)
	if p.in != nil {
		go c.feedStdin(st, p.in, s.stopStdin, s.stdinDone)
	} else {
		close(s.stdinDone)
	}
	return s
}

// finish waits for the output pumps to reach EOF, closing the pipes under
// them after pipeDrainGrace, then stops feeding stdin.
func (s *execStreams) finish(c *conn, st *execState, p *execPipes) {
	drained := make(chan struct{})
	go func() { s.pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(pipeDrainGrace):
		c.log.Debug("output pipes still open after the process ended; closing them", "id", st.id)
		p.out.Close()
		p.errR.Close()
		<-drained
	}
	close(s.stopStdin)
	if p.in != nil {
		p.in.Close()
	}
	<-s.stdinDone
}
