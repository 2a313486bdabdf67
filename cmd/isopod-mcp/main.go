// Command isopod-mcp is isopod's MCP server for coding agents. A client
// (such as Claude Code) starts it as a subprocess and talks to it on stdio;
// with --listen it serves MCP streamable HTTP to remote clients instead. It
// serves until stdin closes or it is told to stop (SIGTERM, SIGINT). See
// docs/mcp-usage.md and docs/fleet.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"isopod/internal/mcpserver"
	"isopod/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The protocol owns the real stdout; anything else that prints goes to
	// stderr.
	proto := os.Stdout
	os.Stdout = os.Stderr
	code := mcpserver.Main(ctx, os.Args[1:], os.Stdin, proto, os.Stderr, version.String())
	stop()
	os.Exit(code)
}
