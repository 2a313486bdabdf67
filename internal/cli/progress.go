package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/stages"
)

// progressEvery is how often a line is logged when stderr is not a
// terminal.
const progressEvery = 2 * time.Second

// progressTo shows a transfer's progress on w: a bar redrawn in place when
// w is a terminal, a line every few seconds (and at the end) otherwise.
func progressTo(w io.Writer) func(stages.Progress) {
	tty := isTerminal(w)
	var mu sync.Mutex
	var last time.Time
	return func(p stages.Progress) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case tty:
			fmt.Fprintf(w, "\r%s\x1b[K", progressBar(p))
			if p.Final {
				fmt.Fprintln(w)
			}
		case p.Final || time.Since(last) >= progressEvery:
			last = time.Now()
			fmt.Fprintf(w, "isopod: %s\n", progressLine(p))
		}
	}
}

// progressLine is one report as a log line.
func progressLine(p stages.Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d/%d done", p.Op, p.ItemsDone, p.Items)
	if p.Skipped > 0 {
		fmt.Fprintf(&b, " (%d already there)", p.Skipped)
	}
	fmt.Fprintf(&b, ", %s", mib(p.Bytes))
	if p.Total > 0 {
		fmt.Fprintf(&b, " of %s", mib(p.Total))
	}
	if p.Item != "" {
		fmt.Fprintf(&b, ", now %s", p.Item)
	}
	if p.Final {
		b.WriteString(", finished")
	}
	return b.String()
}

// progressBar is one report as a terminal line.
func progressBar(p stages.Progress) string {
	const width = 24
	frac := 0.0
	switch {
	case p.Total > 0:
		frac = float64(p.Bytes) / float64(p.Total)
	case p.Items > 0:
		frac = float64(p.ItemsDone) / float64(p.Items)
	}
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	return fmt.Sprintf("%s [%s%s] %3.0f%% %s", p.Op, strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, progressLine(p)[len(p.Op)+2:])
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
