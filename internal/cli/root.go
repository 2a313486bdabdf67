// Package cli is the isopod command line. Every subcommand prints exactly one
// JSON object on stdout (ok first), logs on stderr, and exits 1 with
// {"ok":false,"error":"..."} when it fails.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"isopod/internal/config"
	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
	"isopod/internal/version"
)

// env holds what every subcommand shares.
type env struct {
	svc            *sandbox.Service
	stdout, stderr io.Writer
	log            *slog.Logger
	settings       config.Settings
	// result is the one JSON object to print on success.
	result any
	// code is the exit status after printing result: 0, or 1 for a
	// result that reports a failure itself (isopod doctor).
	code int
	// places are the VM places this process holds (place.go), given back
	// once its VMs' cleanup is done.
	places []func()
}

// service opens the core over the state root. VM cleanup that the report
// does not need runs in the background; Main waits for it before exiting.
func (e *env) service() (*sandbox.Service, error) {
	if e.svc != nil {
		return e.svc, nil
	}
	svc, err := e.settings.NewService(e.log, version.String())
	if err != nil {
		return nil, err
	}
	svc.TeardownInBackground()
	e.svc = svc
	return svc, nil
}

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr}
	settings, err := config.Load(os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "isopod: error: %v\n", err)
		writeJSON(stdout, failure{OK: false, Error: err.Error(), Class: errdefs.Class(err)})
		return 1
	}
	e.settings, e.log = settings, settings.Logger(stderr)
	root := newRoot(e)
	root.SetArgs(args)
	// --help and --version answer on stdout, where they were asked for;
	// every command's JSON goes there too, and nothing else does.
	root.SetOut(stdout)
	root.SetErr(stderr)
	err = root.ExecuteContext(ctx)
	defer e.releasePlaces()
	if e.svc != nil {
		// The JSON goes out first; the process exits once cleanup is done.
		defer e.svc.Wait()
	}
	if err == nil && e.result == nil {
		// --help or a bare group command: nothing was done.
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "isopod: error: %v\n", err)
		writeJSON(stdout, failure{OK: false, Error: err.Error(), Class: errdefs.Class(err)})
		return 1
	}
	writeJSON(stdout, e.result)
	return e.code
}

// failure is the one JSON object of a failed command.
type failure struct {
	OK    bool   `json:"ok"`
	Error string `json:"error"`
	Class string `json:"class"`
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func newRoot(e *env) *cobra.Command {
	var kernel string
	root := &cobra.Command{
		Use:           "isopod",
		Short:         "Run commands in throwaway microVMs; keep state as stages",
		Version:       version.String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// A bare isopod shows the help; anything else that is not a
		// command is refused as an invalid argument.
		Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// --kernel wins over ISOPOD_KERNEL.
			return e.settings.SetKernel(kernel)
		},
	}
	root.PersistentFlags().StringVar(&kernel, "kernel", "", "use this guest kernel (every driver built in; no modules are loaded) instead of the fetched one; also "+knobs.Kernel)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%s: %w: %w", cmd.CommandPath(), err, errdefs.ErrInvalidArgument)
	})
	root.AddCommand(
		newRunCmd(e),
		newImageCmd(e),
		newStageCmd(e),
		newVMCmd(e),
		newDevCmd(e),
		newBenchCmd(e),
		newEgressCmd(e),
		newWarmpoolCmd(e),
		newDoctorCmd(e),
		newSessionCmd(e),
		newSupervisorCmd(e),
	)
	return root
}

// positional wraps a cobra argument check so that a wrong number of
// arguments is an invalid-argument error that names the command and its
// usage.
func positional(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			hint := "usage: " + cmd.UseLine()
			if cmd.HasSubCommands() {
				hint = "see " + cmd.CommandPath() + " --help"
			}
			return fmt.Errorf("%s: %v (%s): %w", cmd.CommandPath(), err, hint, errdefs.ErrInvalidArgument)
		}
		return nil
	}
}

// group is a command that only holds subcommands.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fmt.Errorf("%s needs a subcommand (see --help): %w", cmd.CommandPath(), errdefs.ErrInvalidArgument)
		},
	}
	c.AddCommand(subs...)
	return c
}
