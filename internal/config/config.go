// Package config reads isopod's settings once, at the front ends: the
// environment knobs named in internal/knobs (and the flags that override
// them) become one typed settings.Settings value (with what only a front
// end uses around it), which both front ends hand whole to the core with
// NewService and to the host-I/O policy. Nothing below the front ends
// reads the environment or imports this package.
package config

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/oci"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/settings"
	"isopod/internal/vmm"
)

// DefaultWarmPoolDiskMiB is the warm pool's disk budget unless set.
const DefaultWarmPoolDiskMiB = 8192

// DefaultSessionDiskBudgetMiB is what paused sessions may hold on disk
// together unless set.
const DefaultSessionDiskBudgetMiB = 20480

// DefaultReadyVMs is how many paused VMs a long-lived front end keeps
// ready per hot shape unless set.
const DefaultReadyVMs = 1

// Settings are everything isopod's behaviour depends on outside a
// request: the core's settings, whole, and what only a front end uses.
type Settings struct {
	settings.Settings
	LogLevel slog.Level
	// LongLived is set by a front end that serves many runs (isopod-mcp):
	// it gets ready VMs and builds missing snapshots in the background,
	// and must close the Service.
	LongLived bool
	// Places is the long-lived front end's admission for background VMs
	// (sandbox.Options.Places).
	Places sandbox.Places
}

// coreKnobs are the variables Load reads for the core's settings.
var coreKnobs = []string{knobs.Home, knobs.Kernel, knobs.QEMU, knobs.VMM, knobs.AgentBin, knobs.Accel,
	knobs.AllowBaseSkew, knobs.LogLevel, knobs.Jail, knobs.WarmPool, knobs.WarmPoolDisk, knobs.CredentialMaxBodyMiB, knobs.ReadyVMs,
	knobs.RegistryStallS, knobs.RegistryMinKiBps, knobs.DockerConfig, knobs.MaxVMs, knobs.MemoryBudgetMiB, knobs.SessionMaxLifetimeS, knobs.SessionDiskBudgetMiB}

// Environ is base with the core's settings spelled as the variables s was
// read from (its state root, kernel and the front end's VM limits
// resolved), for a child isopod
// process that must run with this front end's settings: a session's
// supervisor started by isopod-mcp. What base says of those variables is
// dropped.
func (s Settings) Environ(base []string) []string {
	out := make([]string, 0, len(base)+len(coreKnobs))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(coreKnobs, name) {
			out = append(out, kv)
		}
	}
	for _, k := range coreKnobs {
		v, ok := "", false
		if s.LookupEnv != nil {
			v, ok = s.LookupEnv(k)
		}
		switch k {
		case knobs.Home:
			v, ok = s.Paths.Home, s.Paths.Home != ""
		case knobs.Kernel:
			if s.Kernel != "" {
				v, ok = s.Kernel, true
			}
		case knobs.MaxVMs:
			if s.MaxVMs > 0 {
				v, ok = strconv.Itoa(s.MaxVMs), true
			}
		case knobs.MemoryBudgetMiB:
			if s.MemoryBudgetMiB > 0 {
				v, ok = strconv.Itoa(s.MemoryBudgetMiB), true
			}
		}
		if ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// Load reads the settings through lookup (os.LookupEnv in production).
// A value that can never work is an invalid-argument error naming the
// variable and what it accepts.
func Load(lookup func(string) (string, bool)) (Settings, error) {
	var s Settings
	raw := map[string]string{}
	for _, k := range coreKnobs {
		if v, ok := lookup(k); ok {
			raw[k] = v
		}
	}
	s.HostIO = hostIO(lookup)
	s.LookupEnv = lookup
	home := raw[knobs.Home]
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
	if s.LogLevel, err = parseLevel(raw[knobs.LogLevel]); err != nil {
		return s, err
	}
	if err := s.SetKernel(raw[knobs.Kernel]); err != nil {
		return s, err
	}
	s.QEMU, s.AgentBin = raw[knobs.QEMU], raw[knobs.AgentBin]
	switch a := vmm.Accel(strings.TrimSpace(raw[knobs.Accel])); a {
	case vmm.AccelAuto, vmm.AccelKVM, vmm.AccelTCG:
		s.Accel = a
	default:
		return s, fmt.Errorf("%s=%q: use kvm or tcg, or unset it for auto: %w", knobs.Accel, a, errdefs.ErrInvalidArgument)
	}
	s.VMM = strings.ToLower(strings.TrimSpace(raw[knobs.VMM]))
	if err := sandbox.CheckVMM(s.VMM); err != nil {
		return s, err
	}
	s.AllowBaseSkew = raw[knobs.AllowBaseSkew] == "1"
	switch v := strings.ToLower(strings.TrimSpace(raw[knobs.WarmPool])); v {
	case "", "1", "on":
	case "0", "off":
		s.NoWarmPool = true
	default:
		return s, fmt.Errorf("%s=%q: use 0 or off (every run boots cold), or 1 or on, or unset it: %w", knobs.WarmPool, v, errdefs.ErrInvalidArgument)
	}
	if err := parseSizes(raw, &s); err != nil {
		return s, err
	}
	if s.Jail, err = parseJail(raw[knobs.Jail]); err != nil {
		return s, err
	}
	s.ReadyVMs = DefaultReadyVMs
	if v := strings.TrimSpace(raw[knobs.ReadyVMs]); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 16 {
			return s, fmt.Errorf("%s=%q: want a number of VMs from 0 (none) to 16: %w", knobs.ReadyVMs, v, errdefs.ErrInvalidArgument)
		}
		s.ReadyVMs = n
	}
	if s.RegistryStall, err = parseStall(raw[knobs.RegistryStallS], raw[knobs.RegistryMinKiBps]); err != nil {
		return s, err
	}
	if err := parsePlaces(raw, &s); err != nil {
		return s, err
	}
	return s, nil
}

// parseStall reads the registry stall window (whole seconds, 1 to 3600)
// and throughput floor (KiB/s, 0 for none); empty keeps a default.
func parseStall(window, floor string) (oci.Stall, error) {
	st := oci.DefaultStall
	if v := strings.TrimSpace(window); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 3600 {
			return st, fmt.Errorf("%s=%q: want a number of seconds from 1 to 3600: %w", knobs.RegistryStallS, v, errdefs.ErrInvalidArgument)
		}
		st.Window = time.Duration(n) * time.Second
	}
	if v := strings.TrimSpace(floor); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<20 {
			return st, fmt.Errorf("%s=%q: want a number of KiB/s (0: no floor, only silence counts): %w", knobs.RegistryMinKiBps, v, errdefs.ErrInvalidArgument)
		}
		st.MinRate = n << 10
	}
	return st, nil
}

// parseJail reads ISOPOD_JAIL: 1/on (confined, the default), 0/off
// (unconfined, with a warning in every report), unset or empty for the
// default.
func parseJail(v string) (settings.JailMode, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "":
		return settings.JailDefault, nil
	case "0", "off":
		return settings.JailOff, nil
	case "1", "on":
		return settings.JailOn, nil
	}
	return settings.JailDefault, fmt.Errorf("%s=%q: use 1 or on (confined) or 0 or off (unconfined), or unset it: %w", knobs.Jail, v, errdefs.ErrInvalidArgument)
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
	core := s.Settings
	if !s.LongLived {
		core.ReadyVMs = 0
	}
	o := sandbox.Options{Settings: core, Logger: log, Version: version}
	if s.LongLived {
		o.BackgroundSnapshots, o.Places = true, s.Places
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

// hostIO reads the MCP server's host-I/O settings: each switch is on
// unless set to an off value; a value that is neither is read as off, with
// a warning for the start-up log.
func hostIO(lookup func(string) (string, bool)) settings.HostIO {
	var h settings.HostIO
	h.Root, h.RootSet = lookup(knobs.MCPHostIORoot)
	h.StdinFile = readSwitch(lookup, knobs.MCPStdinFile, &h.Warnings)
	h.CopyOut = readSwitch(lookup, knobs.MCPCopyOut, &h.Warnings)
	h.Workspace = readSwitch(lookup, knobs.MCPWorkspace, &h.Warnings)
	return h
}

// readSwitch reads an on/off variable: unset means on; an unknown value
// means off, with a warning.
func readSwitch(lookup func(string) (string, bool), name string, warns *[]string) bool {
	v, ok := lookup(name)
	if !ok {
		return true
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "1", "true", "yes", "enabled", "":
		return true
	case "off", "0", "false", "no", "disabled":
		return false
	}
	*warns = append(*warns, fmt.Sprintf("%s=%q is not on or off; treating it as off", name, v))
	return false
}

// parseSizes reads the byte budgets given in MiB: the warm pool's disk
// budget and the credential endpoint's body cap.
func parseSizes(raw map[string]string, s *Settings) error {
	s.WarmPoolBytes = DefaultWarmPoolDiskMiB << 20
	if v := strings.TrimSpace(raw[knobs.WarmPoolDisk]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%s=%q: want a number of MiB (0 for no budget): %w", knobs.WarmPoolDisk, v, errdefs.ErrInvalidArgument)
		}
		s.WarmPoolBytes = n << 20
	}
	s.SessionDiskBudget = DefaultSessionDiskBudgetMiB << 20
	if v := strings.TrimSpace(raw[knobs.SessionDiskBudgetMiB]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<30 {
			return fmt.Errorf("%s=%q: want a number of MiB (0 for no budget): %w", knobs.SessionDiskBudgetMiB, v, errdefs.ErrInvalidArgument)
		}
		s.SessionDiskBudget = n << 20
	}
	if v := strings.TrimSpace(raw[knobs.CredentialMaxBodyMiB]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > 1<<20 {
			return fmt.Errorf("%s=%q: want a number of MiB from 1 to 1048576: %w", knobs.CredentialMaxBodyMiB, v, errdefs.ErrInvalidArgument)
		}
		s.CredentialMaxBody = n << 20
	}
	return nil
}
