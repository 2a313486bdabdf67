package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/workspace"
)

// workspaceFlags puts --workspace and its companions into req. The flags
// that only shape a workspace are refused without one.
func workspaceFlags(cmd *cobra.Command, req *sandbox.Request, ws workspace.Request, spec string) error {
	if spec == "" {
		for _, name := range []string{"workspace-all", "workspace-out", "workspace-max-bytes", "workspace-max-files", "workspace-max-patch-bytes"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s needs --workspace HOSTDIR: %w", name, errdefs.ErrInvalidArgument)
			}
		}
		return nil
	}
	for _, name := range []string{"workspace-max-bytes", "workspace-max-files", "workspace-max-patch-bytes"} {
		if fl := cmd.Flags().Lookup(name); fl.Changed && !positive(fl.Value.String()) {
			return fmt.Errorf("--%s %s: must be a positive number: %w", name, fl.Value, errdefs.ErrInvalidArgument)
		}
	}
	ws.Host, ws.Guest = splitWorkspace(spec)
	if ws.Host == "" {
		return fmt.Errorf("--workspace %q: the host directory is empty; want HOSTDIR[:GUESTDIR]: %w", spec, errdefs.ErrInvalidArgument)
	}
	ws.Raise = func(what string) string { return capFlags[what] }
	req.Workspace = &ws
	return nil
}

// capFlags names the flag that raises each workspace cap.
var capFlags = map[string]string{
	"entries": "--workspace-max-files", "bytes": "--workspace-max-bytes",
	"patch bytes": "--workspace-max-patch-bytes", "changed bytes": "--workspace-max-patch-bytes",
}

// splitWorkspace splits HOSTDIR[:GUESTDIR] at the last colon that starts
// an absolute guest path, so that a host path holding colons still works.
func splitWorkspace(spec string) (host, guest string) {
	if i := strings.LastIndex(spec, ":/"); i >= 0 {
		return spec[:i], spec[i+1:]
	}
	return spec, ""
}

func positive(s string) bool { return s != "" && s != "0" && !strings.HasPrefix(s, "-") }

// raiseHint adds to each workspace cap's refusal in err (a tree can be
// over two caps at once) the flag that raises it. The error keeps its
// class.
func raiseHint(err error) error {
	flags := capFlags
	msg, added := err.Error(), false
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case *workspace.LimitError:
			if flag := flags[x.What]; flag != "" {
				s := x.Error()
				msg = strings.Replace(msg, s, s+", or raise "+flag, 1)
				added = true
			}
		case interface{ Unwrap() []error }:
			for _, inner := range x.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	if !added {
		return err
	}
	return &hinted{msg: msg, err: err}
}

// hinted is an error with a message of its own.
type hinted struct {
	msg string
	err error
}

func (h *hinted) Error() string { return h.msg }
func (h *hinted) Unwrap() error { return h.err }
