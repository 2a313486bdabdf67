package cli

import (
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// commitTimeout bounds a session commit: the copy of the scratch disk and
// the stage's hash and copy.
const commitTimeout = 10 * time.Minute

func newSessionCommitCmd(e *env) *cobra.Command {
	var label string
	cmd := &cobra.Command{
		Use:   "commit ID|NAME --as LABEL",
		Short: "Store a session's filesystem as a stage, as run --commit-as does; the session keeps running",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sandbox.CheckLabel("as", label); err != nil {
				return err
			}
			_, err := e.callSession(cmd, args[0], session.Call{Op: session.OpCommit, Label: label}, commitTimeout)
			return err
		},
	}
	cmd.Flags().StringVar(&label, "as", "", "the new stage's label (required; as run --commit-as)")
	return cmd
}
