package vmnet

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/proxy"
	"isopod/internal/errdefs"
	"isopod/internal/netstack"
	"isopod/internal/report"
	"isopod/internal/vmm"
)

// Network is one VM's network: its own userspace stack (so no guest can
// reach another), the policy every flow passes, and the per-flow log.
type Network struct {
	stack   *netstack.Stack
	rec     *flightrec.Log // net.jsonl, or egress.jsonl for a filtered run
	sockDir string
	ln      *net.UnixListener // a parked socket, until the stack serves it
	mode    string

	// Filtered mode only.
	filter *egress.Filter
	proxy  *proxy.Server
	env    []string
	creds  *credentials // nil: the run injects none
}

// SocketBase is the user's private directory for the run sockets of the
// state root whose scope (paths.Paths.Scope) is given: each state root
// has its own, so that one root's garbage collection never sees another's
// live runs.
func SocketBase(scope string) (string, error) {
	user := filepath.Join(os.TempDir(), fmt.Sprintf("isopod-%d", os.Getuid()))
	base := filepath.Join(user, scope)
	for attempt := 0; ; attempt++ {
		err := os.MkdirAll(base, 0o700)
		if err == nil {
			break
		}
		// MkdirAll found base made by another run, then gone with that
		// run's end (DropSocketBase) before it could check it: again.
		if !errors.Is(err, fs.ErrExist) || attempt == 8 {
			return "", fmt.Errorf("creating socket directory: %w", err)
		}
	}
	os.Chmod(user, 0o700)
	os.Chmod(base, 0o700)
	return base, nil
}

// DropSocketBase removes the socket directory base of a state root once
// it is empty (its last run's directory removed); one that holds a run's
// directory stays.
func DropSocketBase(base string) { os.Remove(base) }

// socketDir is a short private directory for a VM's unix sockets (a socket
// path must fit in 107 bytes, which a deep $ISOPOD_HOME would not).
func socketDir(scope, id string) (string, error) {
	for attempt := 0; ; attempt++ {
		base, err := SocketBase(scope)
		if err != nil {
			return "", err
		}
		dir := filepath.Join(base, id)
		err = os.Mkdir(dir, 0o700)
		if errors.Is(err, fs.ErrNotExist) && attempt < 8 {
			continue // another run's end dropped the empty base meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("creating socket directory: %w", err)
		}
		return dir, nil
	}
}

// NIC is where a VM's NIC connects: a private socket directory and,
// for a ready VM (ready.go), the listener made before the VM's network,
// which its VMM is already connected to.
type NIC struct {
	dir string
	ln  *net.UnixListener // nil: the stack makes the socket
}

func (n *NIC) path() string { return filepath.Join(n.dir, "net.sock") }

// ParkNIC makes the socket a ready VM's NIC connects to before its run,
// and with it, its network, exists.
func ParkNIC(scope, id string) (*NIC, error) {
	dir, err := socketDir(scope, id)
	if err != nil {
		return nil, err
	}
	n := &NIC{dir: dir}
	if n.ln, err = netstack.Listen(n.path()); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

// Close removes a parked socket that no network took. Idempotent.
func (n *NIC) Close() {
	if n.ln != nil {
		n.ln.Close()
		n.ln = nil
	}
	if n.dir != "" {
		os.RemoveAll(n.dir)
		DropSocketBase(filepath.Dir(n.dir))
		n.dir = ""
	}
}

// VMMNet is the NIC of a VM whose network is started later.
func (n *NIC) VMMNet() *vmm.Net {
	return &vmm.Net{Socket: n.path(), MAC: netstack.DefaultGuestMAC.String()}
}

// takeNIC is the socket a VM's network serves: nic (parked, now the
// network's to close) or a fresh one.
func takeNIC(scope, id string, nic *NIC) (NIC, error) {
	if nic != nil {
		t := *nic
		*nic = NIC{}
		return t, nil
	}
	dir, err := socketDir(scope, id)
	return NIC{dir: dir}, err
}

// NetConfig is what StartNetwork needs.
type Config struct {
	// Scope is the state root's scope (paths.Paths.Scope): run sockets
	// live under SocketBase(Scope).
	Scope string
	// ID is the VM's id; Dir its directory, where the flow log goes.
	ID, Dir string
	// Rules are the request's parsed network policy (the zero Rules: NAT).
	Rules egress.Rules
	// Start is the time flows are logged relative to.
	Start time.Time
	// NIC is a parked socket to serve (ParkNIC), now the network's to
	// close; nil: a new one.
	NIC *NIC
	// Credentials are the credentials the run injects, resolved
	// (credential.Resolve); filtered egress only. Their endpoint is
	// served on the gateway and their hosts are pinned (credentials.go).
	Credentials []Credential
	// CredentialMaxBody caps a request body through the endpoint; 0:
	// credential.DefaultMaxBody.
	CredentialMaxBody int64
	Logger            *slog.Logger // nil: discard
	// Continue: the VM resumes after a pause, and its flow log goes on
	// (appended to, filtered or not).
	Continue bool
}

// StartNetwork starts a VM's stack under cfg.Rules: NAT, or filtered
// egress with its proxies (egress.go). Rolls back on failure.
func Start(cfg Config) (*Network, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rules.Mode() == egress.ModeFiltered {
		return startFiltered(cfg)
	}
	if len(cfg.Credentials) > 0 {
		return nil, fmt.Errorf("credentials need filtered egress: %w", errdefs.ErrInvalidArgument)
	}
	n := &Network{mode: flightrec.ModeNAT}
	ok := false
	defer func() {
		if !ok {
			n.Close()
		}
	}()
	sock, err := takeNIC(cfg.Scope, cfg.ID, cfg.NIC)
	n.sockDir, n.ln = sock.dir, sock.ln
	if err != nil {
		return nil, err
	}
	if n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(cfg.Dir, "net.jsonl"), Mode: flightrec.ModeNAT, Start: cfg.Start, Logger: cfg.Logger, Continue: cfg.Continue}); err != nil {
		return nil, err
	}
	hostAddrs, err := netstack.HostAddrs()
	if err != nil {
		return nil, err
	}
	policy := egress.Policy(&egress.PublicOnly{AllowLAN: cfg.Rules.AllowLAN(), HostAddrs: hostAddrs})
	n.stack, err = netstack.Start(netstack.Config{
		Socket:   sock.path(),
		Listener: sock.ln,
		Policy:   policy,
		Recorder: n.rec,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the network stack: %w", err)
	}
	ok = true
	return n, nil
}

// VMMNet is the VM's NIC, served by the stack.
func (n *Network) VMMNet() *vmm.Net {
	nc := n.stack.NetConfig()
	return &vmm.Net{Socket: n.stack.Socket(), MAC: nc.MAC}
}

// AgentConfig is what the guest's agent configures its network with.
func (n *Network) AgentConfig() *agentproto.NetConfig {
	nc := n.stack.NetConfig()
	nc.Env = append(nc.Env, n.env...)
	return &nc
}

// GuestIP is the guest's address on the stack.
func (n *Network) GuestIP() string { return n.stack.GuestIP().String() }

// Mode is the network's mode as the flow log names it (nat, filtered).
func (n *Network) Mode() string { return n.mode }

// Totals are the flow log's counts so far.
func (n *Network) Totals() flightrec.Totals { return n.rec.Totals() }

// LogPath is the flow log's file.
func (n *Network) LogPath() string { return n.rec.Path() }

// Report is the report's network block: the mode, the flow log's counts
// so far and its file.
func (n *Network) Report() *report.Net {
	t := n.Totals()
	return &report.Net{Mode: n.Mode(), Flows: t.Flows, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown, LogPath: n.LogPath()}
}

// EgressReport is the report's egress block: filtered networks only, else
// nil.
func (n *Network) EgressReport() any {
	if rep := n.rec.Report(); rep != nil {
		return n.creds.report(rep)
	}
	return nil
}

// Close ends every flow and removes the sockets. Idempotent.
func (n *Network) Close() {
	n.creds.close()
	if n.proxy != nil {
		n.proxy.Close()
		n.proxy = nil
	}
	if n.stack != nil {
		n.stack.Close()
		n.stack = nil
	} else if n.ln != nil {
		n.ln.Close()
	}
	n.ln = nil
	if n.rec != nil {
		n.rec.Close()
	}
	if n.sockDir != "" {
		os.RemoveAll(n.sockDir)
		DropSocketBase(filepath.Dir(n.sockDir))
		n.sockDir = ""
	}
}
