package mcpserver

import (
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
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

	Version, Help bool
}

const usage = `usage: isopod-mcp [flags]

isopod's MCP server. Without --listen it serves one client on stdin and
stdout (an MCP client starts it). With --listen it serves MCP streamable
HTTP at /mcp to clients holding a bearer token from --token-file.
Settings other than these flags come from the environment; see
docs/mcp-usage.md and docs/fleet.md.

`

// register binds every flag to f.
func (f *Flags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.Listen, "listen", "", "serve MCP streamable HTTP on `ADDR` (host:port, or unix:/path/to.sock) instead of stdio")
	fs.StringVar(&f.TokenFile, "token-file", "", "with --listen: the bearer tokens, one \"ROLE TOKEN\" a line (ROLE run or admin); required")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "with --listen: serve HTTPS with this certificate (PEM); required unless ADDR is loopback or a unix socket")
	fs.StringVar(&f.TLSKey, "tls-key", "", "with --listen: the certificate's private key (PEM)")
	fs.StringVar(&f.HostIORoot, "host-io-root", "", "with --listen: allow stdin_file and copy_out under this `DIR` on the server (off without it)")
	fs.IntVar(&f.MaxVMs, "max-vms", 0, "VMs this server runs at once (0: from the host's cores and memory)")
	fs.IntVar(&f.Queue, "queue", -1, "calls that may wait for a VM; more are refused as busy (-1: four times --max-vms)")
	fs.IntVar(&f.MemoryBudgetMiB, "memory-budget-mib", 0, "memory all VMs together may take, guest memory plus each VMM's allowance (0: MemTotal less an eighth)")
	fs.StringVar(&f.StageRegistry, "stage-registry", "", "pull stages a call names but this host lacks from `REGISTRY/REPO`")
	fs.BoolVar(&f.PushCommits, "push-commits", false, "push every stage a call commits to --stage-registry, by id and by label")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	fs.BoolVar(&f.Help, "help", false, "print this help and exit")
}

// parseFlags reads args. A usage error is returned after the usage has
// been written to out.
func parseFlags(args []string, out io.Writer) (Flags, error) {
	var f Flags
	fs := flag.NewFlagSet("isopod-mcp", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
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
func (f Flags) admissionConfig(def sandbox.AdmissionConfig) sandbox.AdmissionConfig {
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
