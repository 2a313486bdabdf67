package cli

import (
	"github.com/spf13/cobra"

	"isopod/internal/vmrecord"
)

func newEgressCmd(e *env) *cobra.Command {
	suggest := &cobra.Command{
		Use:   "suggest VM_ID",
		Short: "Print the smallest allowlist that would have allowed what a filtered run tried",
		Long: `Read the egress record of a finished filtered run (typically one run with
--deny-egress) and print the exact --allow-host names and single-address
--allow-cidr ranges that would have allowed every attempt, as JSON with the
flags to pass to the next run. Attempts no rule can allow (UDP, ICMP, the
host's own or private addresses, malformed names) are listed as unallowable.`,
		Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return keep(e)(vmrecord.Records{Paths: e.settings.Paths}.EgressSuggest(cmd.Context(), args[0]))
		},
	}
	return group("egress", "Work with the egress records of filtered runs", suggest)
}
