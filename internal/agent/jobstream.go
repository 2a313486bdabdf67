package agent

import (
	"os"
	"sync"

	"isopod/internal/agentproto"
)

// jobStream is the unread output of one stream of a background job: at
// most agentproto.JobBuffer bytes. When more arrives the oldest unread
// bytes are dropped and counted, so that what a read returns is always
// the newest contiguous run of the stream, told how much came before it
// unseen.
type jobStream struct {
	buf     []byte
	head    int   // buf[head:] is unread
	dropped int64 // unread bytes dropped since the last read
}

func (s *jobStream) write(p []byte) {
	s.buf = append(s.buf, p...)
	if over := len(s.buf) - s.head - agentproto.JobBuffer; over > 0 {
		s.head += over
		s.dropped += int64(over)
	}
	if s.head >= agentproto.JobBuffer/4 {
		// Compact: the read part stays under a quarter of the buffer.
		n := copy(s.buf, s.buf[s.head:])
		s.buf, s.head = s.buf[:n], 0
	}
}

// read takes up to max unread bytes and the count dropped before them.
func (s *jobStream) read(max int) (p []byte, dropped int64) {
	n := min(max, len(s.buf)-s.head)
	p = append([]byte(nil), s.buf[s.head:s.head+n]...)
	s.head += n
	if s.head == len(s.buf) {
		s.buf, s.head = nil, 0 // an idle job holds no buffer
	}
	dropped, s.dropped = s.dropped, 0
	return p, dropped
}

func (s *jobStream) unread() int { return len(s.buf) - s.head }

// pumpJob copies one output pipe of a job into its stream until EOF, then
// closes the pipe: processes the job left keep their output kept too.
func pumpJob(r *os.File, mu *sync.Mutex, s *jobStream, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			mu.Lock()
			s.write(buf[:n])
			mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}
