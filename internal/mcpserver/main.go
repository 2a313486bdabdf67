package mcpserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/config"
	"isopod/internal/sandbox"
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
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel(lookup)}))

	paths, err := pathsFrom(lookup)
	if err != nil {
		log.Error("isopod-mcp: cannot find the state directory", "err", err)
		return 1
	}
	cwd, err := os.Getwd()
	if err != nil {
		// An unusable cwd leaves no root: every host path is refused.
		cwd = ""
	}
	hostIO, warns := HostIOFromEnv(lookup, cwd, paths.Home)
	for _, w := range warns {
		log.Warn(w)
	}
	// The one start-up line that states the host-I/O policy in force.
	log.Info(hostIO.String())

	skew, _ := lookup(config.EnvAllowBaseSkew)
	svc, err := sandbox.New(sandbox.Options{
		Paths:         paths,
		Logger:        log,
		Version:       version,
		AllowBaseSkew: skew == "1",
	})
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
	log.Info("isopod-mcp serving on stdio", "version", version, "state", paths.Home, "allow_base_skew", skew == "1")
	t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	if err := srv.Run(ctx, t); err != nil {
		log.Error("isopod-mcp: session ended with an error", "err", err)
		return 1
	}
	return 0
}

// pathsFrom is config.DefaultPaths over an injectable environment.
func pathsFrom(lookup func(string) (string, bool)) (config.Paths, error) {
	if h, ok := lookup(config.EnvHome); ok && h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return config.Paths{}, fmt.Errorf("resolving %s: %w", config.EnvHome, err)
		}
		return config.Paths{Home: abs}, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return config.Paths{}, fmt.Errorf("finding home directory (set %s): %w", config.EnvHome, err)
	}
	return config.Paths{Home: filepath.Join(home, ".isopod")}, nil
}

func logLevel(lookup func(string) (string, bool)) slog.Level {
	v, _ := lookup(config.EnvLogLevel)
	switch strings.ToLower(v) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
