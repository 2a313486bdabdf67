package mcpserver

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// Flags are isopod-mcp's command line, registered in one place (register).
// Everything else comes from the environment (internal/config).
type Flags struct {
	// Listen serves MCP over streamable HTTP on host:port or unix:PATH
	// instead of stdio.
	Listen    string
	TokenFile string
	TLSCert   string
	TLSKey    string
	// HostIORoot allows stdin_file and copy_out on the listener, under
	// this root; without it they are off there.
	HostIORoot string

	// MaxVMs, Queue and MemoryBudgetMiB override the admission defaults
	// (sandbox.DefaultAdmission); 0 (-1 for Queue) keeps them.
	MaxVMs          int
	Queue           int
	MemoryBudgetMiB int

	StageRegistry string
	PushCommits   bool

	// AllowSessionExpose offers session_expose on the listener.
	AllowSessionExpose bool

	Version, Help bool
}

const usage = `usage: isopod-mcp [flags]

isopod's MCP server. Without --listen it serves one client on stdin and
stdout (an MCP client starts it). With --listen it serves MCP streamable
HTTP at /mcp to clients holding a bearer token from --token-file.
Settings other than these flags come from the environment (below); see
docs/mcp-usage.md and docs/fleet.md.

`

// flagEnv names the environment variable a flag stands in for.
var flagEnv = map[string]string{
	"host-io-root":      knobs.MCPHostIORoot + ", which sets the root on stdio and is ignored with --listen",
	"max-vms":           knobs.MaxVMs + ", the limit the CLI and sessions keep to",
	"memory-budget-mib": knobs.MemoryBudgetMiB + ", the budget the CLI and sessions keep to",
}

// environment is what the server reads from its environment, once, at
// start-up (internal/config); no flag sets these.
var environment = []struct{ name, text string }{
	{knobs.Home, "state root (default ~/.isopod)"},
	{knobs.LogLevel, "stderr log level: debug, info (default), warn, error"},
	{knobs.MCPHostIORoot, "on stdio: the root stdin_file, copy_out and workspace are confined to (default: the working directory)"},
	{knobs.MCPStdinFile, "off refuses stdin_file"},
	{knobs.MCPCopyOut, "off refuses copy_out and workspace_out"},
	{knobs.MCPWorkspace, "off refuses workspace"},
	{knobs.ReadyVMs, "paused VMs kept ready per recently used run shape (default 1, 0 for none, at most 16)"},
	{knobs.WarmPool, "off: every run boots cold and no snapshot is built"},
	{knobs.WarmPoolDisk, "the snapshots' disk budget in MiB (default 8192)"},
	{knobs.AllowBaseSkew, "1 lets forks boot stages made over another build of their base"},
	{knobs.Jail, "on (the default) runs every VMM in its jail; off runs them unconfined"},
	{knobs.Accel, "kvm or tcg, instead of the one found"},
	{knobs.Kernel, "the guest kernel"},
	{knobs.QEMU, "the qemu-system-x86_64 to run"},
	{knobs.VMM, "the VMM driver: qemu (the default, and the only one); another name is refused at start-up"},
	{knobs.AgentBin, "the isopod-agent binary image builds put in a base"},
	{knobs.DockerConfig, "where registry credentials are found (default ~/.docker)"},
}

// help is the --help text: the usage, every flag with what it does (and
// the variable it stands in for, if any), and the environment.
func help() string {
	var b strings.Builder
	b.WriteString(usage)
	b.WriteString("Flags:\n")
	fs := flag.NewFlagSet("isopod-mcp", flag.ContinueOnError)
	new(Flags).register(fs)
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", f.Name)
		if arg != "" {
			fmt.Fprintf(&b, " %s", arg)
		}
		fmt.Fprintf(&b, "\n      %s", text)
		if env := flagEnv[f.Name]; env != "" {
			fmt.Fprintf(&b, "\n      On the listener it stands in for %s.", env)
		}
		b.WriteString("\n")
	})
	b.WriteString("\nEnvironment (read once at start-up; no tool argument can change it):\n")
	for _, e := range environment {
		fmt.Fprintf(&b, "  %-27s %s\n", e.name, e.text)
	}
	return b.String()
}

// register binds every flag to f.
func (f *Flags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.Listen, "listen", "", "serve MCP streamable HTTP at /mcp on `ADDR` (host:port, or unix:/path/to.sock) instead of stdio")
	fs.StringVar(&f.TokenFile, "token-file", "", "with --listen, required: the bearer tokens in `FILE`, one \"ROLE TOKEN\" a line (ROLE run or admin)")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "with --listen: serve HTTPS with the certificate in `FILE` (PEM); required unless ADDR is loopback or a unix socket")
	fs.StringVar(&f.TLSKey, "tls-key", "", "with --listen: the certificate's private key, in `FILE` (PEM)")
	fs.StringVar(&f.HostIORoot, "host-io-root", "", "with --listen: allow stdin_file, copy_out and workspace under `DIR` on the server (off without it)")
	fs.IntVar(&f.MaxVMs, "max-vms", 0, "VMs the host keeps at once, counted with the CLI's runs and the sessions in the state root's ledger: runs, ready VMs and snapshot builds (`N`; 0: from the host's cores and memory)")
	fs.IntVar(&f.Queue, "queue", -1, "calls that may wait for a VM (`N`); one more is refused as busy at once (-1: four times --max-vms)")
	fs.IntVar(&f.MemoryBudgetMiB, "memory-budget-mib", 0, "`MIB` all VMs together may take, guest memory plus each VMM's allowance (0: MemTotal less an eighth)")
	fs.StringVar(&f.StageRegistry, "stage-registry", "", "pull a stage a call names but this host lacks from `REGISTRY/REPO`")
	fs.BoolVar(&f.PushCommits, "push-commits", false, "push every stage a call commits to --stage-registry, by id and by label")
	fs.BoolVar(&f.AllowSessionExpose, "allow-session-expose", false, "with --listen: offer session_expose, which opens ports on this host's 127.0.0.1 (on stdio it is always offered)")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	fs.BoolVar(&f.Help, "help", false, "print this help (also -h) and exit")
}

// parseFlags reads args; flag.ErrHelp for -h or --help.
func parseFlags(args []string) (Flags, error) {
	var f Flags
	fs := flag.NewFlagSet("isopod-mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // -h and --help print help(); an error says itself
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, fmt.Errorf("%w (isopod-mcp --help lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q: isopod-mcp takes flags only (isopod-mcp --help lists them)", fs.Args())
	}
	return f, nil
}

// check refuses flag combinations that cannot work, saying why.
func (f Flags) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if f.Listen == "" {
		for name, v := range map[string]string{"--token-file": f.TokenFile, "--tls-cert": f.TLSCert, "--tls-key": f.TLSKey, "--host-io-root": f.HostIORoot} {
			if v != "" {
				return bad("%s applies only with --listen (on stdio, the client that started the server is trusted; ISOPOD_MCP_HOST_IO_ROOT sets its root)", name)
			}
		}
	}
	if f.Listen == "" && f.AllowSessionExpose {
		return bad("--allow-session-expose applies only with --listen (on stdio session_expose is always offered)")
	}
	switch {
	case f.HostIORoot != "" && !filepath.IsAbs(f.HostIORoot):
		return bad("--host-io-root %s: give an absolute path", f.HostIORoot)
	case f.MaxVMs < 0 || f.Queue < -1 || f.MemoryBudgetMiB < 0:
		return bad("--max-vms, --queue and --memory-budget-mib take counts (got %d, %d, %d)", f.MaxVMs, f.Queue, f.MemoryBudgetMiB)
	case f.PushCommits && f.StageRegistry == "":
		return bad("--push-commits needs --stage-registry to push to")
	case (f.TLSCert == "") != (f.TLSKey == ""):
		return bad("--tls-cert and --tls-key go together")
	case f.Listen == "":
		return nil
	case f.TokenFile == "":
		return bad("--listen %s needs --token-file: every call over the network must carry a bearer token", f.Listen)
	}
	local, err := localAddr(f.Listen)
	if err != nil {
		return err
	}
	if !local && f.TLSCert == "" {
		return bad("--listen %s is reachable beyond this machine, and plain HTTP there would expose the bearer tokens and every result: give --tls-cert and --tls-key, or listen on a loopback address (127.0.0.1:PORT) or a unix socket (unix:/path)", f.Listen)
	}
	return nil
}

// localAddr reports whether a --listen address is reachable from this
// machine only: a unix socket, localhost or a loopback address. An
// address without a host (":8080") listens on every interface.
func localAddr(addr string) (bool, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if path == "" {
			return false, fmt.Errorf("--listen unix: names no socket path: %w", errdefs.ErrInvalidArgument)
		}
		return true, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("--listen %s: give host:port or unix:/path (%v): %w", addr, err, errdefs.ErrInvalidArgument)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// admissionConfig applies the flags to the host's defaults.
func (f Flags) admissionConfig(def admission.Config) admission.Config {
	c := def
	if f.MemoryBudgetMiB > 0 {
		c.MemoryBudgetMiB = f.MemoryBudgetMiB
	}
	if f.MaxVMs > 0 {
		c.MaxVMs = f.MaxVMs
		c.Queue = 4 * f.MaxVMs
	}
	if f.Queue >= 0 {
		c.Queue = f.Queue
	}
	return c
}
