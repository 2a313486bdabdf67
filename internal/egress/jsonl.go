package egress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"isopod/internal/errdefs"
)

// jsonlWriter writes one JSON object a line to a file, flushing each line,
// up to a cap on lines. After the first write failure, or once closed or
// full, it drops lines and says so. It has no lock of its own: its owner
// serialises calls.
type jsonlWriter struct {
	what string // names the file in messages: "egress log", "egress ledger"
	max  int
	log  *slog.Logger

	f       *os.File
	w       *bufio.Writer
	written int
	failed  bool
	closed  bool
}

// validateJSONL checks the settings common to a file's config: what names
// the file in messages, file is its usual name under the run.
func validateJSONL(what, file, path string, maxEvents int) error {
	switch {
	case path == "":
		return fmt.Errorf("%s: empty path (give the run's %s): %w", what, file, errdefs.ErrInvalidArgument)
	case maxEvents < 0:
		return fmt.Errorf("%s: max events %d is negative (0 means the default): %w", what, maxEvents, errdefs.ErrInvalidArgument)
	}
	return nil
}

// jsonlDefaults returns start and maxEvents with a zero start made now and
// a zero cap made DefaultMaxEvents.
func jsonlDefaults(start time.Time, maxEvents int) (time.Time, int) {
	if start.IsZero() {
		start = time.Now()
	}
	if maxEvents == 0 {
		maxEvents = DefaultMaxEvents
	}
	return start, maxEvents
}

// openJSONL opens path with flag (plus O_WRONLY|O_CREATE, mode 0600). max
// must be positive; log nil discards.
func openJSONL(what, path string, flag, max int, log *slog.Logger) (*jsonlWriter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, 0o600)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &jsonlWriter{what: what, max: max, log: log, f: f, w: bufio.NewWriterSize(f, 4096)}, nil
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
		j.log.Warn(j.what+" write failed; later events are only counted", "err", err)
		return false
	}
	j.written++
	return true
}

// name is the file's path.
func (j *jsonlWriter) name() string { return j.f.Name() }

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
		return fmt.Errorf("closing %s: %w", j.what, err)
	}
	return nil
}
