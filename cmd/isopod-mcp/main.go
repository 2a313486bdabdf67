// Command isopod-mcp is isopod's stdio MCP server for coding agents. A client
// (such as Claude Code) starts it as a subprocess; it serves until stdin
// closes. See docs/mcp-usage.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"isopod/internal/mcpserver"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The protocol owns the real stdout; anything else that prints goes to
	// stderr.
	proto := os.Stdout
	os.Stdout = os.Stderr
	code := mcpserver.Main(ctx, os.Stdin, proto, os.Stderr, version)
	stop()
	os.Exit(code)
}
