package mcpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"isopod/internal/admission"
	"isopod/internal/config"
	"isopod/internal/hostio"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
	sess "isopod/internal/session"
	"isopod/internal/stages"
	"isopod/internal/vmrecord"
	"isopod/internal/warmpool"
)

// Main runs isopod-mcp with the command-line arguments args (without the
// program name): over the given stdio streams until the client closes
// stdin or ctx ends, or with --listen on the network until ctx ends. It
// returns the process exit code. Logs go to stderr only; stdout carries
// nothing but the protocol (or --version and --help).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer, stderr io.Writer, version string) int {
	return mainWith(ctx, args, stdin, stdout, stderr, os.LookupEnv, version, nil)
}

// mainWith is Main with the environment and a last-moment Config tweak
// injectable (tests shorten the progress interval).
func mainWith(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer,
	lookup func(string) (string, bool), version string, tweak func(*Config)) int {
	f, err := parseFlags(args)
	switch {
	case errors.Is(err, flag.ErrHelp) || err == nil && f.Help:
		fmt.Fprint(stdout, help())
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "isopod-mcp: %v\n", err)
		return 2
	case f.Version:
		fmt.Fprintln(stdout, "isopod-mcp version "+version)
		return 0
	}
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "isopod-mcp: %v\n", err)
		return 2
	}
	settings, err := config.Load(lookup)
	if err != nil {
		fmt.Fprintf(stderr, "isopod-mcp: %v\n", err)
		return 1
	}
	log := settings.Logger(stderr)
	// The server lives long: the core keeps ready VMs and builds missing
	// snapshots in the background, taking their places from the same
	// admission as the runs (made once the core can say its accelerator).
	places := newLatePlaces()
	settings.LongLived = true
	settings.Places = places
	svc, err := settings.NewService(log, version)
	if err != nil {
		log.Error("isopod-mcp: starting the sandbox core", "err", err)
		return 1
	}
	// Results go back as soon as they are complete; VM cleanup finishes in
	// the background and is waited for before the server exits, and so is
	// the core's background work.
	svc.TeardownInBackground()
	defer svc.Close()
	cfg, err := serverConfig(ctx, f, settings, svc, log, version)
	if err != nil {
		log.Error("isopod-mcp: " + err.Error())
		return 1
	}
	places.set(cfg.Admission)
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		log.Error("isopod-mcp: building the server", "err", err)
		return 1
	}
	if f.Listen != "" {
		return serveNetwork(ctx, srv, f, log, version, settings)
	}
	log.Info("isopod-mcp serving on stdio", "version", version, "state", settings.Paths.Home, "allow_base_skew", settings.AllowBaseSkew)
	t := &StdioTransport{Reader: io.NopCloser(stdin), Writer: stdout, Logger: log}
	if err := srv.Run(ctx, t); err != nil {
		log.Error("isopod-mcp: session ended with an error", "err", err)
		return 1
	}
	return 0
}

// serverConfig builds the server's Config from the flags and settings,
// logging the policies in force: host file I/O and admission.
func serverConfig(ctx context.Context, f Flags, settings config.Settings, svc *sandbox.Service, log *slog.Logger, version string) (Config, error) {
	home := settings.Paths.Home
	var hostIO hostio.Policy
	var warns []string
	if f.Listen != "" {
		hostIO, warns = hostio.Remote(settings.HostIO, f.HostIORoot, home)
	} else {
		cwd, err := os.Getwd()
		if err != nil {
			// An unusable cwd leaves no root: every host path is refused.
			cwd = ""
		}
		hostIO, warns = hostio.Local(settings.HostIO, cwd, home)
	}
	for _, w := range warns {
		log.Warn(w)
	}
	// The one start-up line that states the host-I/O policy in force.
	log.Info(hostIO.String())
	ac := f.admissionConfig(settings.Admission(svc.AccelGuess(ctx)))
	// Its places are counted in the state root's ledger with the CLI's
	// runs and the sessions', against the same limits.
	l, err := settings.Ledger("isopod-mcp")
	if err != nil {
		return Config{}, err
	}
	ac.Ledger = l
	adm, err := admission.New(ac)
	if err != nil {
		return Config{}, fmt.Errorf("admission: %w (set --max-vms, --queue, --memory-budget-mib)", err)
	}
	// A session's supervisor counts against the same limits as this
	// server's calls.
	settings.MaxVMs, settings.MemoryBudgetMiB = ac.MaxVMs, ac.MemoryBudgetMiB
	log.Info("admission", "max_vms", ac.MaxVMs, "queue", ac.Queue, "memory_budget_mib", ac.MemoryBudgetMiB,
		"vm_cost_mib", fmt.Sprintf("mem_mib+%d", ac.OverheadMiB))
	if f.StageRegistry != "" {
		log.Info("stage registry", "repo", f.StageRegistry, "push_commits", f.PushCommits)
	}
	return Config{
		Sessions: sessionConfig(f, settings, svc, log),
		Core: core{svc, stages.New(stages.Options{Settings: settings.Settings, Logger: log, Version: version, Removed: func() {
			svc.StageRemoved()
			warmpool.New(settings.Paths, log).RetireOrphans()
		}}),
			vmrecord.Records{Paths: settings.Paths}}, HostIO: hostIO, Logger: log, Version: version,
		Admission: adm, Remote: f.Listen != "",
		StageRegistry: f.StageRegistry, PushCommits: f.PushCommits,
	}, nil
}

// serveNetwork serves --listen until ctx ends.
func serveNetwork(ctx context.Context, srv *Server, f Flags, log *slog.Logger, version string, settings config.Settings) int {
	tokens, warns, err := LoadTokens(f.TokenFile)
	if err != nil {
		log.Error("isopod-mcp: " + err.Error())
		return 1
	}
	for _, w := range warns {
		log.Warn(w)
	}
	var tlsCfg *tls.Config
	if f.TLSCert != "" {
		if tlsCfg, err = LoadTLS(f.TLSCert, f.TLSKey); err != nil {
			log.Error("isopod-mcp: " + err.Error())
			return 1
		}
	}
	ln, err := Listen(f.Listen)
	if err != nil {
		log.Error("isopod-mcp: " + err.Error())
		return 1
	}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	log.Info("isopod-mcp serving MCP over HTTP", "url", scheme+"://"+ln.Addr().String()+MCPPath,
		"version", version, "state", settings.Paths.Home, "tokens", len(tokens.entries))
	if err := srv.Serve(ctx, ln, srv.Handler(tokens), tlsCfg); err != nil {
		log.Error("isopod-mcp: " + err.Error())
		return 1
	}
	return 0
}

// sessionConfig sets up the session tools: the CLI's sessions under the
// same state root, their supervisors started from the isopod binary
// beside this one with this server's settings.
func sessionConfig(f Flags, settings config.Settings, svc *sandbox.Service, log *slog.Logger) *SessionConfig {
	sc := &SessionConfig{Store: sess.Store{Paths: settings.Paths}, Check: svc.CheckVM, AllowExpose: f.AllowSessionExpose,
		MaxLifetimeS: settings.SessionMaxLifetimeS, LifetimeSetting: knobs.SessionMaxLifetimeS}
	self, _ := os.Executable()
	bin, err := FindIsopod(self)
	if err != nil {
		log.Warn("sessions are off: " + plain(err))
		sc.NoBinary = err
		return sc
	}
	sc.Launcher = sess.Launcher{Binary: bin, Env: settings.Environ(os.Environ())}
	log.Info("sessions", "supervisor", bin, "expose_over_http", f.AllowSessionExpose)
	return sc
}
