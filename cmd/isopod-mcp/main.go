// Command isopod-mcp is isopod's stdio MCP server for coding agents. A client
// (such as Claude Code) starts it as a subprocess; it serves until stdin
// closes or it is told to stop (SIGTERM, SIGINT). See docs/mcp-usage.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"isopod/internal/mcpserver"
	"isopod/internal/version"
)

const usage = `usage: isopod-mcp [--version | --help]

isopod's MCP server on stdin/stdout. An MCP client starts it; it is not run
by hand. Settings come from the environment; see docs/mcp-usage.md.
`

func main() {
	switch {
	case len(os.Args) == 1:
	case len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version"):
		fmt.Println("isopod-mcp version " + version.String())
		return
	case len(os.Args) == 2 && (os.Args[1] == "--help" || os.Args[1] == "-h" || os.Args[1] == "-help"):
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "isopod-mcp: unexpected arguments %q\n%s", os.Args[1:], usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The protocol owns the real stdout; anything else that prints goes to
	// stderr.
	proto := os.Stdout
	os.Stdout = os.Stderr
	code := mcpserver.Main(ctx, os.Stdin, proto, os.Stderr, version.String())
	stop()
	os.Exit(code)
}
