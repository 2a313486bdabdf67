package agent

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"isopod/internal/agentproto"
)

// A kept exec (Exec.Keep) leaves what its process started running when
// the process exits, and those processes may hold the output pipes open
// for ever. Its output therefore ends with the process, not with the
// pipes: once the process has exited, each pump goes on sending only
// while the pipe has more within pipeDrainGrace of the last read (and for
// at most keepDrainMax in all), which is what the process wrote before it
// exited. After that the pump keeps reading and discards what the
// processes left behind write, until the last of them closes the pipe:
// they never block on a full pipe nor die of a broken one.

// keepDrainMax bounds the drain of a kept exec's pipes after its process
// exited, against processes it left that write without pause.
const keepDrainMax = 2 * time.Second

// keepDrain tells a kept exec's pumps that the process has exited.
type keepDrain struct {
	on       atomic.Bool
	hardStop atomic.Int64 // unix nanoseconds; set before on
}

// next is the read deadline of a draining pump.
func (d *keepDrain) next() time.Time {
	t := time.Now().Add(pipeDrainGrace)
	if stop := time.Unix(0, d.hardStop.Load()); stop.Before(t) {
		return stop
	}
	return t
}

// pumpKept sends one output pipe of a kept exec as KindOutput frames until
// the drain ends (sent.Done), then discards the rest until EOF and closes
// the pipe.
func (c *conn) pumpKept(id uint64, stream string, r *os.File, d *keepDrain, sent *sync.WaitGroup) {
	defer r.Close()
	buf := make([]byte, agentproto.ChunkSize)
	sending := true
	for {
		if sending && d.on.Load() {
			r.SetReadDeadline(d.next())
		}
		n, err := r.Read(buf)
		if n > 0 && sending {
			c.reply(&agentproto.Msg{ID: id, Kind: agentproto.KindOutput, Stream: stream}, buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if sending {
				sending = false
				sent.Done()
			}
			r.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			break
		}
	}
	if sending {
		sent.Done()
	}
}

// startKeptStreams is startStreams for a kept exec: the pumps own the read
// ends, which outlive the exec while processes it left hold them.
func (c *conn) startKeptStreams(st *execState, p *execPipes) *execStreams {
	s := &execStreams{stopStdin: make(chan struct{}), stdinDone: make(chan struct{}), drain: &keepDrain{}}
	s.out, s.errR = p.out, p.errR
	p.out, p.errR = nil, nil
	s.pumps.Add(2)
	go c.pumpKept(st.id, "stdout", s.out, s.drain, &s.pumps)
	go c.pumpKept(st.id, "stderr", s.errR, s.drain, &s.pumps)
	if p.in != nil {
		go c.feedStdin(st, p.in, s.stopStdin, s.stdinDone)
	} else {
		close(s.stdinDone)
	}
	return s
}

// finishKept ends a kept exec's output once its process has exited: it
// waits for the pumps to drain what the process wrote, then stops feeding
// stdin.
func (s *execStreams) finishKept(p *execPipes) {
	s.drain.hardStop.Store(time.Now().Add(keepDrainMax).UnixNano())
	s.drain.on.Store(true)
	t := s.drain.next()
	s.out.SetReadDeadline(t)
	s.errR.SetReadDeadline(t)
	s.pumps.Wait()
	close(s.stopStdin)
	if p.in != nil {
		p.in.Close()
	}
	<-s.stdinDone
}
