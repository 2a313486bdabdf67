package cli

import (
	"github.com/spf13/cobra"

	"isopod/internal/stages"
)

// newStagePushCmd is `isopod stage push REF DEST`.
func newStagePushCmd(e *env) *cobra.Command {
	var o stages.StagePushOptions
	cmd := &cobra.Command{
		Use:   "push REF DEST",
		Short: "Push a stage, its chain and its base to a registry (DEST: REGISTRY/REPO[:TAG], the tag defaults to the stage id)",
		Long: `Push a stage and every layer of its chain to a registry as one OCI artifact,
and the base it was made over as another (tagged base-<content id> in the
same repository), so that a host without that base build can pull and fork
it. Blobs the registry already has are not sent again.`,
		Args: positional(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Progress = progressTo(e.stderr)
			return callStore(e, func(s *stages.Service) (*stages.StagePushResult, error) {
				return s.StagePush(cmd.Context(), args[0], args[1], o)
			})
		},
	}
	cmd.Flags().BoolVar(&o.WithoutBase, "without-base", false, "do not push the base; a host without that base build cannot use the stage")
	return cmd
}

// newStagePullCmd is `isopod stage pull SOURCE`.
func newStagePullCmd(e *env) *cobra.Command {
	var o stages.StagePullOptions
	cmd := &cobra.Command{
		Use:   "pull SOURCE",
		Short: "Pull a stage, its chain and (when missing here) its base from a registry (SOURCE: REGISTRY/REPO:TAG or @DIGEST)",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Progress = progressTo(e.stderr)
			return callStore(e, func(s *stages.Service) (*stages.StagePullResult, error) {
				return s.StagePull(cmd.Context(), args[0], o)
			})
		},
	}
	cmd.Flags().StringVar(&o.As, "as", "", "label the stage here (default: the label it was pushed with)")
	return cmd
}
