package flightrec

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
)

// jsonlWriter writes one JSON object a line to a file, flushing each line,
// up to a cap on lines. After the first write failure, or once closed or
// full, it drops lines and says so. It has no lock of its own: its owner
// serialises calls.
type jsonlWriter struct {
	max int
	log *slog.Logger

	f       *os.File
	w       *bufio.Writer
	written int
	failed  bool
	closed  bool
}

// openJSONL opens path with flag (plus O_WRONLY|O_CREATE, mode 0600). max
// must be positive; log nil discards.
func openJSONL(path string, flag, max int, log *slog.Logger) (*jsonlWriter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, 0o600)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &jsonlWriter{max: max, log: log, f: f, w: bufio.NewWriterSize(f, 4096)}, nil
}

// write appends v as one line and reports whether it was written; false
// means the line was dropped (closed, full, or an earlier or this write
// failed). The first failure is logged once.
func (j *jsonlWriter) write(v any) bool {
	if j.closed || j.failed || j.written >= j.max {
		return false
	}
	line, err := json.Marshal(v)
	if err == nil {
		line = append(line, '\n')
		if _, err = j.w.Write(line); err == nil {
			err = j.w.Flush()
		}
	}
	if err != nil {
		j.failed = true
		j.log.Warn("flight recorder write failed; later events are only counted", "path", j.f.Name(), "err", err)
		return false
	}
	j.written++
	return true
}

// close flushes and closes the file; later writes are dropped. Idempotent.
func (j *jsonlWriter) close() error {
	if j.closed {
		return nil
	}
	j.closed = true
	err := j.w.Flush()
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("closing flight record %s: %w", j.f.Name(), err)
	}
	return nil
}
