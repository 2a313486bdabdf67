package cli

import (
	"github.com/spf13/cobra"

	"isopod/internal/image"
	"isopod/internal/stages"
)

// newImageImportCmd is `isopod image import SOURCE`.
func newImageImportCmd(e *env) *cobra.Command {
	var o stages.ImageImportOptions
	var maxMiB int64
	cmd := &cobra.Command{
		Use:   "import SOURCE",
		Short: "Make a base of a container image: REGISTRY/REPO[:TAG|@DIGEST], oci:DIR[:TAG] or docker-archive:FILE",
		Long: `Make a base of a container image's linux/amd64 root filesystem. SOURCE is a
registry reference (docker:// optional), an OCI image layout (oci:DIR[:TAG])
or a docker save archive (docker-archive:FILE[:REF]). Every blob is checked
against its digest. Runs then use the base with --base NAME; the image's Env
and WorkingDir are their defaults, its Entrypoint and Cmd are not used.
Registry credentials come from Docker's config.json and credential helpers
(DOCKER_CONFIG, else ~/.docker).`,
		Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.MaxBytes = maxMiB << 20
			o.Progress = progressTo(e.stderr)
			return callStore(e, func(s *stages.Service) (*stages.ImageImportResult, error) {
				return s.ImageImport(cmd.Context(), args[0], o)
			})
		},
	}
	cmd.Flags().StringVar(&o.Name, "name", "", "what runs call the base (--base NAME); default: from the source, e.g. alpine-3.20")
	cmd.Flags().Int64Var(&maxMiB, "max-mib", image.DefaultImportMaxBytes>>20, "refuse an image whose files add up to more than this many MiB")
	return cmd
}

// newImageRmCmd is `isopod image rm NAME`.
func newImageRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove an imported base (or a pulled base build, by content id); refused while stages or warm-pool snapshots use it",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callStore(e, func(s *stages.Service) (*stages.ImageRemoveResult, error) {
				return s.ImageRemove(cmd.Context(), args[0])
			})
		},
	}
}
