package mcpserver

import (
	"context"
	"fmt"
	"io"
	"os"

	"isopod/internal/config"
)

// Main runs isopod-mcp over the given stdio streams until the client closes
// stdin or ctx ends, and returns the process exit code. Logs go to stderr
// only; stdout carries nothing but the protocol.
func Main(ctx context.Context, stdin io.Reader, stdout io.Writer, stderr io.Writer, version string) int {
	return mainWith(ctx, stdin, stdout, stderr, os.LookupEnv, version, nil)
}

// mainWith is Main with the environment and a last-moment Config tweak
// injectable (tests shorten the progress interval).
func mainWith(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer,
	lookup func(string) (string, bool), version string, tweak func(*Config)) int {
	settings, err := config.Load(lookup)
	if err != nil {
		fmt.Fprintf(stderr, "isopod-mcp: %v\n", err)
		return 1
	}
	log := settings.Logger(stderr)
	paths := settings.Paths
	cwd, err := os.Getwd()
	if err != nil {
		// An unusable cwd leaves no root: every host path is refused.
		cwd = ""
	}
	hostIO, warns := HostIOFromEnv(settings.Lookup, cwd, paths.Home)
	for _, w := range warns {
		log.Warn(w)
	}
	// The one start-up line that states the host-I/O policy in force.
	log.Info(hostIO.String())

	svc, err := settings.NewService(log, version)
	if err != nil {
		log.Error("isopod-mcp: starting the sandbox core", "err", err)
		return 1
	}
	// Results go back as soon as they are complete; VM cleanup finishes in
	// the background and is waited for before the server exits.
	svc.TeardownInBackground()
	defer svc.Wait()
	cfg := Config{Core: svc, HostIO: hostIO, Logger: log, Version: version}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		log.Error("isopod-mcp: building the server", "err", err)
		return 1
	}
	log.Info("isopod-mcp serving on stdio", "version", version, "state", paths.Home, "allow_base_skew", settings.AllowBaseSkew)
	t := &StdioTransport{Reader: io.NopCloser(stdin), Writer: stdout, Logger: log}
	if err := srv.Run(ctx, t); err != nil {
		log.Error("isopod-mcp: session ended with an error", "err", err)
		return 1
	}
	return 0
}
