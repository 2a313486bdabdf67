package sandbox

import (
	"fmt"
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
	mode    string

	// Filtered mode only.
	filter *egress.Filter
	proxy  *proxy.Server
	env    []string
}

// socketBase is the user's private directory for run sockets.
func socketBase() (string, error) {
	base := filepath.Join(os.TempDir(), fmt.Sprintf("isopod-%d", os.Getuid()))
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	os.Chmod(base, 0o700)
	return base, nil
}

// socketDir is a short private directory for a run's unix sockets (a socket
// path must fit in 107 bytes, which a deep $ISOPOD_HOME would not).
func socketDir(id string) (string, error) {
	base, err := socketBase()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	return dir, nil
}

// startNetwork starts the run's stack. Rolls back on failure.
func (s *Service) startNetwork(id, dir string, req Request, start time.Time) (*runNetwork, error) {
	if filteredRequest(req) {
		return s.startFilteredNetwork(id, dir, req, start)
	}
	n := &runNetwork{mode: flightrec.ModeNAT}
	ok := false
	defer func() {
		if !ok {
			n.close()
		}
	}()
	var err error
	if n.sockDir, err = socketDir(id); err != nil {
		return nil, err
	}
	if n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(dir, "net.jsonl"), Mode: flightrec.ModeNAT, Start: start, Logger: s.log}); err != nil {
		return nil, err
	}
	hostAddrs, err := netstack.HostAddrs()
	if err != nil {
		return nil, err
	}
	policy := egress.Policy(&egress.PublicOnly{AllowLAN: req.AllowLANEgress, HostAddrs: hostAddrs})
	n.stack, err = netstack.Start(netstack.Config{
		Socket:   filepath.Join(n.sockDir, "net.sock"),
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
	}
	if n.rec != nil {
		n.rec.Close()
	}
	if n.sockDir != "" {
		os.RemoveAll(n.sockDir)
		n.sockDir = ""
	}
}
