package mcpserver

import (
	"slices"

	"github.com/google/jsonschema-go/jsonschema"

	"isopod/internal/hostio"
)

// The sandbox_run schema a client sees names only the host-path arguments
// this server's policy lets through: a network listener without
// --host-io-root, or a switch that is off, leaves them out. A call that
// sends one anyway is still checked against the whole schema, and its
// refusal says what to ask the operator for.

// hostPathArgs are the sandbox_run arguments that name files on the
// server's host, each with whether the policy h allows it.
func hostPathArgs(h hostio.Policy) map[string]bool {
	root := h.HasRoot()
	return map[string]bool{
		"stdin_file":    root && h.StdinFile,
		"copy_out":      root && h.CopyOut,
		"workspace":     root && h.Workspace,
		"workspace_all": root && h.Workspace,
		"workspace_out": root && h.Workspace && h.CopyOut,
	}
}

// advertisedRunSchema is sc without the host-path arguments h refuses.
func advertisedRunSchema(sc *jsonschema.Schema, h hostio.Policy) *jsonschema.Schema {
	out := *sc
	out.Properties = map[string]*jsonschema.Schema{}
	for name, p := range sc.Properties {
		if usable, hostPath := hostPathArgs(h)[name]; !hostPath || usable {
			out.Properties[name] = p
		}
	}
	out.PropertyOrder = slices.DeleteFunc(slices.Clone(sc.PropertyOrder), func(name string) bool {
		_, kept := out.Properties[name]
		return !kept
	})
	return &out
}
