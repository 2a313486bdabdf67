package cli

import (
	"strings"

	"github.com/spf13/cobra"

	"isopod/internal/sandbox"
	"isopod/internal/warmpool"
)

func newWarmpoolCmd(e *env) *cobra.Command {
	var o warmpool.BuildOptions
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the snapshot runs of this shape resume from (skipped when current)",
		Args:  positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range []string{"vcpus", "mem-mib"} {
				if fl := cmd.Flags().Lookup(name); fl.Changed && fl.Value.String() == "0" {
					return sandbox.CheckSize(strings.ReplaceAll(name, "-", "_"), 0)
				}
			}
			return call(e, func(s *sandbox.Service) (*warmpool.BuildResult, error) { return s.WarmBuild(cmd.Context(), o) })
		},
	}
	f := build.Flags()
	f.StringVar(&o.Base, "base", "", "base image: base-min (default) or base-debian")
	f.StringVar(&o.Stage, "stage", "", "build the snapshot of runs on this stage with their root assembled (base: the base alone)")
	f.BoolVar(&o.NoNetwork, "no-network", false, "build for --no-network runs (a VM without a NIC)")
	f.IntVar(&o.VCPUs, "vcpus", sandbox.DefaultVCPUs, "virtual CPUs, as the runs will ask")
	f.IntVar(&o.MemMiB, "mem-mib", sandbox.DefaultMemMiB, "guest memory in MiB, as the runs will ask")
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List warm-pool snapshots, newest first", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(e, func(s *sandbox.Service) (*warmpool.ListResult, error) {
				return warmpool.New(e.settings.Paths, e.log).List(s.WarmStale(cmd.Context())), nil
			})
		},
	}
	var all bool
	rm := &cobra.Command{
		Use: "rm KEY | --all", Short: "Remove a warm-pool snapshot, or all of them", Args: positional(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := ""
			if len(args) == 1 {
				key = args[0]
			}
			return keep(e)(warmpool.New(e.settings.Paths, e.log).Remove(key, all))
		},
	}
	rm.Flags().BoolVar(&all, "all", false, "remove every snapshot")
	return group("warmpool", "Manage the snapshots that eligible runs resume from", build, list, rm)
}
