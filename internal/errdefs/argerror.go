package errdefs

import (
	"fmt"
	"strings"
)

// An ArgError is one request field the core refused. It names the field
// neutrally so that each front end can say it in its own words: Error()
// says it the CLI way ("--timeout-s 0: must be ..."), and the MCP server
// names its argument instead ("timeout_s: must be ... (got 0)"). It wraps
// ErrInvalidArgument.
type ArgError struct {
	// Field is the request field as the MCP tool argument names it
	// (timeout_s, vcpus, mem_mib, scratch_mib, env, cwd, copy_out,
	// commit_as); CLIFlag turns it into the flag.
	Field string
	// Value is the refused value as text; empty when there is none to show.
	Value string
	// Reason says what is wrong and what would be right, in words neither
	// front end owns.
	Reason string
}

func (e *ArgError) Error() string {
	if e.Value == "" {
		return CLIFlag(e.Field) + ": " + e.Reason
	}
	return CLIFlag(e.Field) + " " + e.Value + ": " + e.Reason
}

func (e *ArgError) Unwrap() error { return ErrInvalidArgument }

// CLIFlag names a request field as the isopod run flag that sets it.
func CLIFlag(field string) string {
	switch field {
	case "argv":
		return "the command (after --)"
	case "allow_hosts":
		return "--allow-host"
	case "allow_cidrs":
		return "--allow-cidr"
	}
	return "--" + strings.ReplaceAll(field, "_", "-")
}

// Arg is an ArgError of field: value (nil: none to show) refused for
// the reason format says.
func Arg(field string, value any, format string, args ...any) error {
	v := ""
	if value != nil {
		v = fmt.Sprint(value)
	}
	return &ArgError{Field: field, Value: v, Reason: fmt.Sprintf(format, args...)}
}
