// Package config reads isopod's settings once, at the front ends: the
// environment knobs named in internal/knobs (and the flags that override
// them) become one typed Settings value, and both front ends build the core
// from it with NewService. Nothing below the front ends reads the
// environment or imports this package.
package config

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
)

// DefaultWarmPoolDiskMiB is the warm pool's disk budget unless set.
const DefaultWarmPoolDiskMiB = 8192

// DefaultReadyVMs is how many paused VMs a long-lived front end keeps
// ready per hot shape unless set.
const DefaultReadyVMs = 1

// Settings are everything isopod's behaviour depends on outside a request.
type Settings struct {
	Paths paths.Paths
	// DockerConfig is Docker's configuration directory (DOCKER_CONFIG,
	// else ~/.docker), for registry credentials.
	DockerConfig string
	LogLevel     slog.Level
	// Kernel is a custom guest kernel (--kernel or ISOPOD_KERNEL), made
	// absolute; empty: the fetched one.
	Kernel   string
	QEMU     string
	AgentBin string
	Accel    vmm.Accel
	// AllowBaseSkew: ISOPOD_ALLOW_BASE_SKEW=1.
	AllowBaseSkew bool
	// Jail: ISOPOD_JAIL, whether the VMM runs inside its jail.
	Jail sandbox.JailMode
	// NoWarmPool: ISOPOD_WARM_POOL=off, every run boots cold.
	NoWarmPool bool
	// WarmPoolBytes: ISOPOD_WARM_POOL_DISK_MIB, the snapshots' disk
	// budget (default DefaultWarmPoolDiskMiB).
	WarmPoolBytes int64
	// ReadyVMs: ISOPOD_READY_VMS, the ready VMs per hot shape a
	// long-lived front end keeps (default DefaultReadyVMs; 0 none).
	ReadyVMs int
	// LongLived is set by a front end that serves many runs (isopod-mcp):
	// it gets ready VMs and builds missing snapshots in the background,
	// and must close the Service.
	LongLived bool
	// Places is the long-lived front end's admission for background VMs
	// (sandbox.Options.Places).
	Places sandbox.Places

	// raw keeps every knob as read, for front-end policies that interpret
	// their own (the MCP server's host-I/O switches).
	raw map[string]string
}

// Load reads the settings through lookup (os.LookupEnv in production).
// A value that can never work is an invalid-argument error naming the
// variable and what it accepts.
func Load(lookup func(string) (string, bool)) (Settings, error) {
	s := Settings{raw: map[string]string{}}
	for _, k := range []string{knobs.Home, knobs.Kernel, knobs.QEMU, knobs.AgentBin, knobs.Accel,
		knobs.AllowBaseSkew, knobs.LogLevel, knobs.Jail, knobs.WarmPool, knobs.WarmPoolDisk, knobs.ReadyVMs, knobs.MCPHostIORoot, knobs.MCPCopyOut, knobs.MCPStdinFile, knobs.MCPWorkspace} {
		if v, ok := lookup(k); ok {
			s.raw[k] = v
		}
	}
	home := s.raw[knobs.Home]
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return s, fmt.Errorf("finding the home directory (set %s): %w", knobs.Home, err)
		}
		home = filepath.Join(h, ".isopod")
	}
	p, err := paths.New(home)
	if err != nil {
		return s, fmt.Errorf("%s: %w", knobs.Home, err)
	}
	s.Paths = p
	if s.DockerConfig, err = dockerConfigDir(lookup); err != nil {
		return s, err
	}
	if s.LogLevel, err = parseLevel(s.raw[knobs.LogLevel]); err != nil {
		return s, err
	}
	if err := s.SetKernel(s.raw[knobs.Kernel]); err != nil {
		return s, err
	}
	s.QEMU, s.AgentBin = s.raw[knobs.QEMU], s.raw[knobs.AgentBin]
	switch a := vmm.Accel(strings.TrimSpace(s.raw[knobs.Accel])); a {
	case vmm.AccelAuto, vmm.AccelKVM, vmm.AccelTCG:
		s.Accel = a
	default:
		return s, fmt.Errorf("%s=%q: use kvm or tcg, or unset it for auto: %w", knobs.Accel, a, errdefs.ErrInvalidArgument)
	}
	s.AllowBaseSkew = s.raw[knobs.AllowBaseSkew] == "1"
	switch v := strings.ToLower(strings.TrimSpace(s.raw[knobs.WarmPool])); v {
	case "", "1", "on":
	case "0", "off":
		s.NoWarmPool = true
	default:
		return s, fmt.Errorf("%s=%q: use 0 or off (every run boots cold), or 1 or on, or unset it: %w", knobs.WarmPool, v, errdefs.ErrInvalidArgument)
	}
	s.WarmPoolBytes = DefaultWarmPoolDiskMiB << 20
	if v := strings.TrimSpace(s.raw[knobs.WarmPoolDisk]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return s, fmt.Errorf("%s=%q: want a number of MiB (0 for no budget): %w", knobs.WarmPoolDisk, v, errdefs.ErrInvalidArgument)
		}
		s.WarmPoolBytes = n << 20
	}
	if s.Jail, err = parseJail(s.raw[knobs.Jail]); err != nil {
		return s, err
	}
	s.ReadyVMs = DefaultReadyVMs
	if v := strings.TrimSpace(s.raw[knobs.ReadyVMs]); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 16 {
			return s, fmt.Errorf("%s=%q: want a number of VMs from 0 (none) to 16: %w", knobs.ReadyVMs, v, errdefs.ErrInvalidArgument)
		}
		s.ReadyVMs = n
	}
	return s, nil
}

// parseJail reads ISOPOD_JAIL: 1/on (confined, the default), 0/off
// (unconfined, with a warning in every report), unset or empty for the
// default.
func parseJail(v string) (sandbox.JailMode, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "":
		return sandbox.JailDefault, nil
	case "0", "off":
		return sandbox.JailOff, nil
	case "1", "on":
		return sandbox.JailOn, nil
	}
	return sandbox.JailDefault, fmt.Errorf("%s=%q: use 1 or on (confined) or 0 or off (unconfined), or unset it: %w", knobs.Jail, v, errdefs.ErrInvalidArgument)
}

// SetKernel sets the custom guest kernel (a --kernel flag wins over
// ISOPOD_KERNEL); empty keeps the fetched one.
func (s *Settings) SetKernel(path string) error {
	if path == "" {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("--kernel/%s %q: %w: %w", knobs.Kernel, path, err, errdefs.ErrInvalidArgument)
	}
	s.Kernel = abs
	return nil
}

// Lookup returns a knob's value as read by Load.
func (s Settings) Lookup(name string) (string, bool) {
	v, ok := s.raw[name]
	return v, ok
}

func parseLevel(v string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, fmt.Errorf("%s=%q: use debug, info, warn or error: %w", knobs.LogLevel, v, errdefs.ErrInvalidArgument)
}

// Logger is a text logger to w at the settings' level.
func (s Settings) Logger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: s.LogLevel}))
}

// NewService builds the core from the settings.
func (s Settings) NewService(log *slog.Logger, version string) (*sandbox.Service, error) {
	o := sandbox.Options{
		Paths:         s.Paths,
		DockerConfig:  s.DockerConfig,
		Logger:        log,
		Version:       version,
		AllowBaseSkew: s.AllowBaseSkew,
		Kernel:        s.Kernel,
		AgentBin:      s.AgentBin,
		QEMU:          s.QEMU,
		Accel:         s.Accel,
		Jail:          s.Jail,
		NoWarmPool:    s.NoWarmPool,
		WarmPoolBytes: s.WarmPoolBytes,
	}
	if s.LongLived {
		o.ReadyVMs, o.BackgroundSnapshots, o.Places = s.ReadyVMs, true, s.Places
	}
	return sandbox.New(o)
}

// dockerConfigDir is where Docker's config.json is: DOCKER_CONFIG, else
// ~/.docker (empty when there is no home directory: anonymous).
func dockerConfigDir(lookup func(string) (string, bool)) (string, error) {
	if v, ok := lookup(knobs.DockerConfig); ok && v != "" {
		abs, err := filepath.Abs(v)
		if err != nil {
			return "", fmt.Errorf("%s %q: %w: %w", knobs.DockerConfig, v, err, errdefs.ErrInvalidArgument)
		}
		return abs, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", nil
	}
	return filepath.Join(h, ".docker"), nil
}
