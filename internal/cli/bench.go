package cli

import (
	"github.com/spf13/cobra"

	"isopod/internal/bench"
	"isopod/internal/sandbox"
	"isopod/internal/version"
)

func newBenchCmd(e *env) *cobra.Command {
	var o bench.Options
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure isopod against its floor, side by side in one run",
		Long: `Measure total_ms of sequential runs side by side with the floor (the same
QEMU, kernel and initramfs booting an init that powers off at once), a
networked run, a fork of a 3-layer stage, a 100 MiB commit, where the
warm pool applies, warm runs, and (as root, with base-debian) a 1 MiB GET
through the credential endpoint beside one through the HTTP proxy.
Prints p50/p90 per series and their ratios.`,
		Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(e, func(s *sandbox.Service) (*bench.Result, error) {
				// The series that boot run on a Service without the warm pool.
				cs := e.settings
				cs.NoWarmPool = true
				cold, err := cs.NewService(e.log, version.String())
				if err != nil {
					return nil, err
				}
				defer cold.Close()
				o.Cold, o.Stages = cold, e.stageStore()
				// The credential series' Service reads the bench's own store.
				o.CredService = func(store string) (*sandbox.Service, error) {
					core := cs.Settings
					core.ReadyVMs = 0
					return sandbox.New(sandbox.Options{Settings: core, Logger: e.log, Version: version.String(), CredentialStore: store})
				}
				return bench.Run(cmd.Context(), s, e.log, o)
			})
		},
	}
	c.Flags().IntVarP(&o.N, "n", "n", 10, "samples per series")
	c.Flags().StringSliceVar(&o.Series, "series", nil, "series to run (cold, floor, network, fork, commit, warm, credential); default all")
	return c
}
