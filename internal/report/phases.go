package report

import (
	"context"
	"log/slog"
	"time"
)

// Phases records when each step of a run ended, as milliseconds since its
// start, for one debug line per run: where a run's time goes without a
// profiler.
type Phases struct {
	names []string
	ms    []float64
}

// Mark notes that the step name ended now.
func (p *Phases) Mark(name string, t0 time.Time) {
	p.names = append(p.names, name)
	p.ms = append(p.ms, float64(time.Since(t0).Microseconds())/1000)
}

// End notes the last step, "stopped" (the VMM killed, the report
// complete), and writes the steps at debug level.
func (p *Phases) End(log *slog.Logger, rep *Run, t0 time.Time) {
	p.Mark("stopped", t0)
	if !log.Enabled(context.Background(), slog.LevelDebug) || len(p.names) == 0 {
		return
	}
	args := make([]any, 0, 2*len(p.names)+2)
	if rep != nil {
		args = append(args, "vm", rep.VMID)
	}
	for i, n := range p.names {
		args = append(args, n, p.ms[i])
	}
	log.Debug("run phases (ms since the run began)", args...)
}
