package cli

import (
	"context"

	"github.com/spf13/cobra"

	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/version"
	"isopod/internal/vmrecord"
	"isopod/internal/warmpool"
)

// call runs fn against the service and keeps its result for printing.
func call[T any](e *env, fn func(*sandbox.Service) (T, error)) error {
	svc, err := e.service()
	if err != nil {
		return err
	}
	res, err := fn(svc)
	if err != nil {
		return err
	}
	e.result = res
	return nil
}

// callStore runs fn against the stage and base store and keeps its
// result for printing.
func callStore[T any](e *env, fn func(*stages.Service) (T, error)) error {
	return keep(e)(fn(e.stageStore()))
}

// keep returns a function that keeps a result for printing.
func keep(e *env) func(res any, err error) error {
	return func(res any, err error) error {
		if err != nil {
			return err
		}
		e.result = res
		return nil
	}
}

// stageStore opens the stage and base store over the state root.
func (e *env) stageStore() *stages.Service {
	// A removed stage's assembled warm-pool snapshots go with it.
	removed := func() { warmpool.New(e.settings.Paths, e.log).RetireOrphans() }
	return stages.New(stages.Options{Settings: e.settings.Settings, Logger: e.log, Version: version.String(), Removed: removed})
}

func newStageCmd(e *env) *cobra.Command {
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List stages, oldest first", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callStore(e, func(s *stages.Service) (*stages.StageListResult, error) { return s.StageList(cmd.Context()) })
		},
	}
	info := &cobra.Command{
		Use: "info REF", Short: "Describe a stage, its chain and layer paths", Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.StageInfoResult, error) { return s.StageInfo(cmd.Context(), args[0]) })
		},
	}
	rm := &cobra.Command{
		Use: "rm REF", Short: "Remove a stage no other stage builds on", Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.StageRemoveResult, error) {
				return s.StageRemove(cmd.Context(), args[0])
			})
		},
	}
	log := &cobra.Command{
		Use: "log REF", Short: "The chain from base to REF: each layer, the command that made it, when, its size", Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.StageLogResult, error) { return s.StageLog(cmd.Context(), args[0]) })
		},
	}
	diff := &cobra.Command{
		Use: "diff A B", Short: "Files added, changed and removed from stage A to stage B", Args: positional(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.StageDiffResult, error) {
				return s.StageDiff(cmd.Context(), args[0], args[1])
			})
		},
	}
	return group("stage", "Inspect, prune and share stages", list, info, rm, log, diff, newStagePushCmd(e), newStagePullCmd(e))
}

func newVMCmd(e *env) *cobra.Command {
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List VM records, newest first; live: the VMM still runs", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return keep(e)(vmrecord.Records{Paths: e.settings.Paths}.VMList(cmd.Context()))
		},
	}
	var keep int
	gc := &cobra.Command{
		Use: "gc", Short: "Kill orphaned VMM processes and prune old VM records", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(e, func(s *sandbox.Service) (*report.VMGC, error) { return s.VMGC(cmd.Context(), keep) })
		},
	}
	gc.Flags().IntVar(&keep, "keep-last", 20, "keep this many newest records; 0 keeps none (a VM still running, or a run still going, is always kept)")
	return group("vm", "List and clean up VM records", ls, gc)
}

func newImageCmd(e *env) *cobra.Command {
	var fk stages.FetchKernelOptions
	fetch := &cobra.Command{
		Use: "fetch-kernel", Short: "Fetch the pinned Debian cloud kernel and verify its digest", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callStore(e, func(s *stages.Service) (*stages.FetchKernelResult, error) { return s.FetchKernel(cmd.Context(), fk) })
		},
	}
	fetch.Flags().StringVar(&fk.FromDeb, "from-deb", "", "use this kernel .deb instead of downloading it with apt-get")
	fetch.Flags().BoolVar(&fk.AllowUnpinned, "allow-unpinned", false, "take the newest cloud kernel apt verifies when the pinned one is no longer served")
	fetch.Flags().BoolVar(&fk.Force, "force", false, "fetch again even if present")
	buildAll := &cobra.Command{
		Use: "build-all", Short: "Build the initramfs and every base image", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callStore(e, func(s *stages.Service) (*stages.BuildImagesResult, error) { return s.BuildImages(cmd.Context(), nil) })
		},
	}
	build := &cobra.Command{
		Use: "build FLAVOR...", Short: "Build the initramfs and the named base images (base-min, base-debian)", Args: positional(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.BuildImagesResult, error) {
				return s.BuildImages(cmd.Context(), args)
			})
		},
	}
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List the bases a run accepts", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callStore(e, func(s *stages.Service) (*stages.ImageListResult, error) { return s.ImageList(cmd.Context()) })
		},
	}
	return group("image", "Fetch the guest kernel, build guest images, import bases", fetch, buildAll, build, ls,
		newImageImportCmd(e), newImageRmCmd(e))
}

func newDevCmd(e *env) *cobra.Command {
	boot := &cobra.Command{
		Use: "boot", Short: "Boot a throwaway VM with no network and report its boot latency", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(e, func(s *sandbox.Service) (*devBootResult, error) { return devBoot(cmd.Context(), s) })
		},
	}
	return group("dev", "Developer tools", boot)
}

// devBootResult reports a throwaway boot.
type devBootResult struct {
	OK            bool   `json:"ok"`
	VMID          string `json:"vm_id"`
	Name          string `json:"name"`
	BootMS        int64  `json:"boot_ms"`
	TotalMS       int64  `json:"total_ms"`
	Accel         string `json:"accel"`
	SerialLogPath string `json:"serial_log_path"`
}

// devBoot boots a throwaway VM without a network, runs `true` in it and
// reports how long the boot took.
func devBoot(ctx context.Context, s *sandbox.Service) (*devBootResult, error) {
	rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, TimeoutS: 60})
	if err != nil {
		return nil, err
	}
	res := &devBootResult{OK: true, VMID: rep.VMID, Name: rep.Name, TotalMS: rep.TotalMS, Accel: string(rep.Accel), SerialLogPath: rep.SerialLogPath}
	if rep.BootMS != nil {
		res.BootMS = *rep.BootMS
	}
	return res, nil
}
