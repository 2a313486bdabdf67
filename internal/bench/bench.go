// Package bench measures isopod side by side with its floor: the same VMM,
// kernel and initramfs started directly, with nothing of a run around it.
// Every ratio comes from series taken in one process, interleaved where
// load drift could favour one side. It uses the core's public API only, plus
// the floor hooks the core exposes for it.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"isopod/internal/admission"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/vmm"
)

// Options selects what `isopod bench` measures.
type Options struct {
	N int // samples per series
	// Series to run; empty means all that apply: cold, floor, network,
	// fork, commit, warm, credential.
	Series []string
	// Cold is a Service with the warm pool off, for the series that boot
	// (cold, network, fork, and the warm series' cold side); nil: the
	// Service given, which then must have it off for those to boot.
	Cold *sandbox.Service
	// Stages removes the stages the fork and commit series make; nil:
	// they stay.
	Stages *stages.Service
	// CredService makes a Service, with the warm pool off, that resolves
	// aliases from the credential store at store (sandbox.Options'
	// CredentialStore), for the credential series; nil: that series is
	// skipped.
	CredService func(store string) (*sandbox.Service, error)
}

// Stats summarises one series of samples in milliseconds.
type Stats struct {
	N   int     `json:"n"`
	Min float64 `json:"min_ms"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	Max float64 `json:"max_ms"`
}

func stats(samples []float64) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	pick := func(q float64) float64 {
		i := int(q*float64(len(s)-1) + 0.5)
		return s[i]
	}
	return Stats{N: len(s), Min: s[0], P50: pick(0.5), P90: pick(0.9), Max: s[len(s)-1]}
}

// Result is what `isopod bench` prints.
type Result struct {
	OK      bool               `json:"ok"`
	Machine string             `json:"machine"`
	Accel   string             `json:"accel"`
	Series  map[string]Stats   `json:"series"`
	Ratios  map[string]float64 `json:"ratios"`
	Extra   map[string]any     `json:"extra,omitempty"`
	// HostStealPct is the share of the host's CPU time its hypervisor
	// took for other guests while the bench ran (steal.go), in percent;
	// absent where it cannot be told.
	HostStealPct *float64 `json:"host_steal_pct,omitempty"`
}

// benchSeries are the series --series accepts.
var benchSeries = []string{"cold", "floor", "network", "fork", "commit", "warm", "credential"}

// Run measures isopod side by side with its floor in one process.
func Run(ctx context.Context, s *sandbox.Service, log *slog.Logger, o Options) (*Result, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &bench{s: s, cold: o.Cold, stages: o.Stages, log: log}
	if b.cold == nil {
		b.cold = s
	}
	return b.run(ctx, o)
}

// bench is one benchmark invocation: s resumes from the warm pool, cold
// boots.
type bench struct {
	s, cold *sandbox.Service
	stages  *stages.Service
	log     *slog.Logger
	accel   string // the credential series' VM's accelerator
}

// removeStage removes a stage a series made, when it can.
func (b *bench) removeStage(ctx context.Context, label string) {
	if b.stages != nil {
		b.stages.StageRemove(context.WithoutCancel(ctx), label)
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func (b *bench) run(ctx context.Context, o Options) (*Result, error) {
	want, err := selectSeries(o)
	if err != nil {
		return nil, err
	}
	res := &Result{OK: true, Machine: machineDesc(), Series: map[string]Stats{}, Ratios: map[string]float64{}, Extra: map[string]any{}}
	if t0, ok := readCPUTimes(); ok {
		defer func() {
			if t1, ok := readCPUTimes(); ok {
				if p := stealPct(t0, t1); p >= 0 {
					res.HostStealPct = &p
				}
			}
		}()
	}
	total := b.totalMS(ctx, res)
	if want.has("cold") || want.has("floor") {
		if err := b.coldAndFloor(ctx, o.N, res, total); err != nil {
			return nil, err
		}
	}
	if want.has("network") {
		st, err := b.sampleSeries(ctx, "network", o.N, total(sandbox.Request{Argv: []string{"true"}, ScratchMiB: sandbox.DefaultScratchMiB}))
		if err != nil {
			return nil, err
		}
		res.Series["network"] = st
	}
	if c, ok := res.Series["cold"]; ok {
		if n, ok := res.Series["network"]; ok {
			res.Ratios["network_p50_over_no_network_p50"] = ratio(n.P50, c.P50)
		}
	}
	if want.has("warm") {
		if err := b.warmSeries(ctx, o.N, res); err != nil {
			return nil, err
		}
	}
	if want.has("fork") {
		if err := b.fork(ctx, o.N, res, total); err != nil {
			return nil, err
		}
	}
	if want.has("commit") {
		if err := b.commit(ctx, res); err != nil {
			return nil, err
		}
	}
	if want.has("credential") {
		if err := b.credentialSeries(ctx, o.N, o.CredService, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// seriesSet is the series a bench measures; empty means all of them.
type seriesSet map[string]bool

// has reports whether the series name is to be measured.
func (w seriesSet) has(name string) bool {
	return len(w) == 0 || w[name]
}

// selectSeries checks o and returns the series it asks for.
func selectSeries(o Options) (seriesSet, error) {
	if o.N < 1 {
		return nil, invalid("bench -n %d: want at least 1 sample per series", o.N)
	}
	want := seriesSet{}
	for _, x := range o.Series {
		if !slices.Contains(benchSeries, x) {
			return nil, invalid("bench --series %q: unknown (known: %s)", x, strings.Join(benchSeries, ", "))
		}
		want[x] = true
	}
	return want, nil
}

// totalMS returns a sampler factory: each sampler boots a VM for req (on
// the cold Service) and gives its total milliseconds, failing when the
// command does not exit 0 or the run did not boot. It
// records the run's accelerator in res.
func (b *bench) totalMS(ctx context.Context, res *Result) func(sandbox.Request) func() (float64, error) {
	return func(req sandbox.Request) func() (float64, error) {
		return func() (float64, error) {
			rep, err := b.cold.Run(ctx, req)
			if err != nil {
				return 0, err
			}
			if rep.ExitCode == nil || *rep.ExitCode != 0 {
				return 0, fmt.Errorf("the benchmark command failed: %s", rep.Stderr)
			}
			if rep.Path != "cold" {
				return 0, fmt.Errorf("a run the benchmark needs cold resumed: give it a Service with the warm pool off: %w", errdefs.ErrFailedPrecondition)
			}
			res.Accel = string(rep.Accel)
			return float64(rep.TotalMS), nil
		}
	}
}

// sampleSeries takes n samples of fn, stopping when ctx ends, and
// summarises them.
func (b *bench) sampleSeries(ctx context.Context, name string, n int, fn func() (float64, error)) (Stats, error) {
	var xs []float64
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return Stats{}, err
		}
		x, err := fn()
		if err != nil {
			return Stats{}, fmt.Errorf("bench %s: %w", name, err)
		}
		xs = append(xs, x)
		b.log.Info("bench sample", "series", name, "i", i, "ms", x)
	}
	return stats(xs), nil
}

// coldAndFloor measures the cold and floor series, alternating them so
// that load drift hits both alike, and their ratio.
func (b *bench) coldAndFloor(ctx context.Context, n int, res *Result, total func(sandbox.Request) func() (float64, error)) error {
	var cold, floor []float64
	for i := 0; i < n; i++ {
		c, err := total(sandbox.Request{Argv: []string{"true"}, NoNetwork: true})()
		if err != nil {
			return fmt.Errorf("bench cold: %w", err)
		}
		f, err := b.floor(ctx)
		if err != nil {
			return fmt.Errorf("bench floor: %w", err)
		}
		b.log.Info("bench sample", "i", i, "cold_ms", c, "floor_ms", f)
		cold, floor = append(cold, c), append(floor, f)
	}
	res.Series["cold"], res.Series["floor"] = stats(cold), stats(floor)
	res.Ratios["cold_p50_over_floor_p50"] = ratio(res.Series["cold"].P50, res.Series["floor"].P50)
	return nil
}

// warmSeries measures warm starts against cold ones and the QEMU restore
// floor, and records their series, ratios and throughput in res.
func (b *bench) warmSeries(ctx context.Context, n int, res *Result) error {
	w, err := b.warm(ctx, n)
	if err != nil {
		return fmt.Errorf("bench warm: %w", err)
	}
	res.Series["warm_cold_total"] = stats(msFloats(w.ColdTotalMS))
	res.Series["warm_total"] = stats(msFloats(w.WarmTotalMS))
	res.Series["warm_resume"] = stats(msFloats(w.ResumeMS))
	res.Series["warm_qemu_floor"] = stats(msFloats(w.QEMUFloorMS))
	res.Ratios["warm_total_p50_over_cold_total_p50"] = ratio(w.WarmOverCold, 1)
	res.Ratios["resume_p50_over_qemu_floor_p50"] = ratio(w.ResumeOverFloor, 1)
	res.Extra["warm_vms_per_minute"] = w.WarmVMsPerMinute
	if res.Accel == "" {
		res.Accel = string(w.Accel)
	}
	return nil
}

// msFloats converts whole milliseconds to the float samples stats takes.
func msFloats(xs []int64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return float64(int(a/b*1000+0.5)) / 1000
}

// floor boots the same VMM, kernel and initramfs with an init that powers
// off at once, and returns the milliseconds from start to exit.
func (b *bench) floor(ctx context.Context) (float64, error) {
	drv, err := b.s.Driver(ctx)
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "isopod-floor-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cfg, err := b.floorConfig(dir)
	if err != nil {
		return 0, err
	}
	t := time.Now()
	m, err := drv.Start(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer m.Agent().Close()
	select {
	case <-m.Done():
	case <-time.After(60 * time.Second):
		m.Kill()
		m.Wait()
		return 0, fmt.Errorf("the floor VM did not power off within 60 s: %w", errdefs.ErrUnavailable)
	}
	m.Wait()
	return float64(time.Since(t).Microseconds()) / 1000, nil
}

// fork compares a run on a 3-layer stage with a run on base.
func (b *bench) fork(ctx context.Context, n int, res *Result, total func(sandbox.Request) func() (float64, error)) error {
	s := b.s
	prefix := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().Unix())
	var labels []string
	defer func() {
		for i := len(labels) - 1; i >= 0; i-- {
			b.removeStage(ctx, labels[i])
		}
	}()
	parent := sandbox.BaseStage
	for i := 0; i < 3; i++ {
		l := fmt.Sprintf("%s/l%d", prefix, i)
		rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"sh", "-c", fmt.Sprintf("head -c 1048576 /dev/urandom > /root/layer%d", i)}, NoNetwork: true, Stage: parent, CommitAs: l})
		if err != nil {
			return err
		}
		if rep.StageID == "" {
			return fmt.Errorf("bench fork: layer %d did not commit", i)
		}
		labels = append(labels, l)
		parent = l
	}
	var base, fork []float64
	for i := 0; i < n; i++ {
		bt, err := total(sandbox.Request{Argv: []string{"true"}, NoNetwork: true})()
		if err != nil {
			return err
		}
		f, err := total(sandbox.Request{Argv: []string{"true"}, NoNetwork: true, Stage: parent})()
		if err != nil {
			return err
		}
		base, fork = append(base, bt), append(fork, f)
	}
	res.Series["fork_base"], res.Series["fork_3_layers"] = stats(base), stats(fork)
	res.Ratios["fork_3_layers_p50_over_base_p50"] = ratio(res.Series["fork_3_layers"].P50, res.Series["fork_base"].P50)
	return nil
}

// commit commits a 100 MiB layer and reports where the time went.
func (b *bench) commit(ctx context.Context, res *Result) error {
	s := b.s
	l := fmt.Sprintf("bench-%d-%d/commit", os.Getpid(), time.Now().Unix())
	rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"sh", "-c", "head -c 104857600 /dev/urandom > /root/big"}, NoNetwork: true, CommitAs: l, TimeoutS: 600})
	if err != nil {
		return err
	}
	defer b.removeStage(ctx, l)
	if rep.CommitMS == nil {
		return fmt.Errorf("bench commit: nothing committed")
	}
	res.Extra["commit_100mib"] = map[string]int64{
		"commit_ms": *rep.CommitMS, "commit_hash_ms": *rep.CommitHashMS, "commit_copy_ms": *rep.CommitCopyMS,
	}
	return nil
}

// machineDesc describes the host for BENCHMARKS.md.
func machineDesc() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				_, model, _ = strings.Cut(line, ":")
				model = strings.TrimSpace(model)
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mem := admission.ReadHost().MemTotalMiB
	return fmt.Sprintf("%s; %d CPUs; %d MiB; Linux %s; %s", model, runtime.NumCPU(), mem, strings.TrimSpace(string(kernel)), filepath.Base(os.Args[0]))
}

// floorConfig is a VM with a run's kernel, initramfs, command line and
// sizes, whose init powers off at once. dir must exist.
func (b *bench) floorConfig(dir string) (vmm.Config, error) {
	k, err := b.s.Boot()
	if err != nil {
		return vmm.Config{}, err
	}
	return vmm.Config{
		ID: "floor", Dir: dir, Kernel: k.Kernel, BzImage: k.BzImage, Initrd: k.Initramfs,
		Cmdline: machine.Cmdline("floor") + " -- " + agentproto.FloorArg,
		VCPUs:   sandbox.DefaultVCPUs, MemMiB: sandbox.DefaultMemMiB, SerialLog: io.Discard, Logger: b.log,
	}, nil
}
