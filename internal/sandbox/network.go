package sandbox

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/proxy"
	"isopod/internal/netstack"
	"isopod/internal/vmm"
)

// runNetwork is a run's network: its own userspace stack (so no guest can
// reach another), the policy every flow passes, and the per-flow log.
type runNetwork struct {
	stack   *netstack.Stack
	rec     *flightrec.Log // net.jsonl, or egress.jsonl for a filtered run
	sockDir string
	ln      *net.UnixListener // a parked socket, until the stack serves it
	mode    string

	// Filtered mode only.
	filter *egress.Filter
	proxy  *proxy.Server
	env    []string
}

// socketBase is the user's private directory for the run sockets of the
// state root whose scope (paths.Paths.Scope) is given: each state root
// has its own, so that one root's garbage collection never sees another's
// live runs.
func socketBase(scope string) (string, error) {
	user := filepath.Join(os.TempDir(), fmt.Sprintf("isopod-%d", os.Getuid()))
	base := filepath.Join(user, scope)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	os.Chmod(user, 0o700)
	os.Chmod(base, 0o700)
	return base, nil
}

// socketDir is a short private directory for a run's unix sockets (a socket
// path must fit in 107 bytes, which a deep $ISOPOD_HOME would not).
func socketDir(scope, id string) (string, error) {
	base, err := socketBase(scope)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	return dir, nil
}

// nicSocket is where a VM's NIC connects: a private socket directory and,
// for a ready VM (ready.go), the listener made before the VM's network,
// which its VMM is already connected to.
type nicSocket struct {
	dir string
	ln  *net.UnixListener // nil: the stack makes the socket
}

func (n *nicSocket) path() string { return filepath.Join(n.dir, "net.sock") }

// parkNIC makes the socket a ready VM's NIC connects to before its run,
// and with it, its network, exists.
func parkNIC(scope, id string) (*nicSocket, error) {
	dir, err := socketDir(scope, id)
	if err != nil {
		return nil, err
	}
	n := &nicSocket{dir: dir}
	if n.ln, err = netstack.Listen(n.path()); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

// close removes a parked socket that no network took. Idempotent.
func (n *nicSocket) close() {
	if n.ln != nil {
		n.ln.Close()
		n.ln = nil
	}
	if n.dir != "" {
		os.RemoveAll(n.dir)
		n.dir = ""
	}
}

// vmmNet is the NIC of a VM whose network is started later.
func (n *nicSocket) vmmNet() *vmm.Net {
	return &vmm.Net{Socket: n.path(), MAC: netstack.DefaultGuestMAC.String()}
}

// takeNIC is the socket a run's network serves: nic (parked, now the
// network's to close) or a fresh one.
func takeNIC(scope, id string, nic *nicSocket) (nicSocket, error) {
	if nic != nil {
		t := *nic
		*nic = nicSocket{}
		return t, nil
	}
	dir, err := socketDir(scope, id)
	return nicSocket{dir: dir}, err
}

// startNetwork starts the run's stack under rules, the request's parsed
// network policy (the zero Rules: NAT). Rolls back on failure.
func (s *Service) startNetwork(id, dir string, rules egress.Rules, start time.Time) (*runNetwork, error) {
	return s.startNetworkOn(nil, id, dir, rules, start)
}

// startNetworkOn is startNetwork serving the parked socket nic (nil: a
// new one).
func (s *Service) startNetworkOn(nic *nicSocket, id, dir string, rules egress.Rules, start time.Time) (*runNetwork, error) {
	if rules.Mode() == egress.ModeFiltered {
		return s.startFilteredNetwork(nic, id, dir, rules, start)
	}
	n := &runNetwork{mode: flightrec.ModeNAT}
	ok := false
	defer func() {
		if !ok {
			n.close()
		}
	}()
	sock, err := takeNIC(s.opts.Paths.Scope(), id, nic)
	n.sockDir, n.ln = sock.dir, sock.ln
	if err != nil {
		return nil, err
	}
	if n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(dir, "net.jsonl"), Mode: flightrec.ModeNAT, Start: start, Logger: s.log}); err != nil {
		return nil, err
	}
	hostAddrs, err := netstack.HostAddrs()
	if err != nil {
		return nil, err
	}
	policy := egress.Policy(&egress.PublicOnly{AllowLAN: rules.AllowLAN(), HostAddrs: hostAddrs})
	n.stack, err = netstack.Start(netstack.Config{
		Socket:   sock.path(),
		Listener: sock.ln,
		Policy:   policy,
		Recorder: n.rec,
		Logger:   s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the network stack: %w", err)
	}
	ok = true
	return n, nil
}

func (n *runNetwork) vmmNet() *vmm.Net {
	nc := n.stack.NetConfig()
	return &vmm.Net{Socket: n.stack.Socket(), MAC: nc.MAC}
}

func (n *runNetwork) agentConfig() *agentproto.NetConfig {
	nc := n.stack.NetConfig()
	nc.Env = append(nc.Env, n.env...)
	return &nc
}

func (n *runNetwork) guestIP() string { return n.stack.GuestIP().String() }

func (n *runNetwork) report() *NetReport {
	t := n.rec.Totals()
	return &NetReport{Mode: n.mode, Flows: t.Flows, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown, LogPath: n.rec.Path()}
}

// egressReport is the report's egress block: filtered runs only.
func (n *runNetwork) egressReport() any {
	if rep := n.rec.Report(); rep != nil {
		return rep
	}
	return nil
}

// close ends every flow and removes the sockets. Idempotent.
func (n *runNetwork) close() {
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
		n.sockDir = ""
	}
}
