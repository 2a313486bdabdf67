package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/proxy"
	"isopod/internal/errdefs"
	"isopod/internal/netstack"
)

// Gateway ports of the proxy-aware path of filtered egress.
const (
	HTTPProxyPort = 3128
	SOCKSPort     = 1080
	// EgressLogName is the flight recorder's file in a filtered run's VM
	// directory.
	EgressLogName = "egress.jsonl"
)

// startFilteredNetwork starts a filtered run's network: the stack with the
// Filter over rules as its policy, sniffer and DNS resolver, the flight recorder
// writing egress.jsonl, and the HTTP and SOCKS5 proxies on the gateway.
// Rolls back on failure.
func (s *Service) startFilteredNetwork(nic *nicSocket, id, dir string, rules egress.Rules, start time.Time) (*runNetwork, error) {
	n := &runNetwork{mode: flightrec.ModeFiltered}
	ok := false
	defer func() {
		if !ok {
			n.close()
		}
	}()
	hostAddrs, err := netstack.HostAddrs()
	if err != nil {
		return nil, err
	}
	n.filter, err = egress.NewFilter(egress.FilterConfig{Rules: rules, HostAddrs: hostAddrs, Lookup: lookupIPv4})
	if err != nil {
		return nil, err
	}
	sock, err := takeNIC(s.opts.Paths.Scope(), id, nic)
	n.sockDir, n.ln = sock.dir, sock.ln
	if err != nil {
		return nil, err
	}
	n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(dir, EgressLogName), Start: start,
		Mode: flightrec.ModeFiltered, Rules: rules, Logger: s.log})
	if err != nil {
		return nil, err
	}
	n.stack, err = netstack.Start(netstack.Config{
		Socket:   sock.path(),
		Listener: sock.ln,
		Policy:   n.filter,
		DNS:      netstack.ResolverHandler(n.filter),
		Recorder: n.rec,
		Logger:   s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the network stack: %w", err)
	}
	n.proxy, err = proxy.New(proxy.Config{Filter: n.filter, Recorder: n.rec,
		Dial: (&net.Dialer{}).DialContext, Logger: s.log})
	if err != nil {
		return nil, err
	}
	httpL, err := n.stack.ListenTCP(HTTPProxyPort)
	if err != nil {
		return nil, err
	}
	socksL, err := n.stack.ListenTCP(SOCKSPort)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := n.proxy.ServeHTTPProxy(httpL); err != nil {
			s.log.Debug("http proxy ended", "err", err)
		}
	}()
	go func() {
		if err := n.proxy.ServeSOCKS(socksL); err != nil {
			s.log.Debug("socks proxy ended", "err", err)
		}
	}()
	n.env = ProxyEnv(n.stack.NetConfig().Gateway)
	ok = true
	return n, nil
}

// ProxyEnv is the environment a filtered run's commands get: the gateway's
// HTTP proxy for http and https, its SOCKS5 proxy (names resolved by the
// proxy) for everything else, in both upper and lower case.
func ProxyEnv(gateway string) []string {
	httpProxy := "http://" + net.JoinHostPort(gateway, strconv.Itoa(HTTPProxyPort))
	socks := "socks5h://" + net.JoinHostPort(gateway, strconv.Itoa(SOCKSPort))
	noProxy := "localhost,127.0.0.1,::1"
	var env []string
	for _, kv := range [][2]string{
		{"HTTP_PROXY", httpProxy}, {"HTTPS_PROXY", httpProxy}, {"ALL_PROXY", socks}, {"NO_PROXY", noProxy},
	} {
		env = append(env, kv[0]+"="+kv[1], strings.ToLower(kv[0])+"="+kv[1])
	}
	return env
}

// lookupIPv4 resolves an allowed name through the host's resolver.
func lookupIPv4(ctx context.Context, name string) ([]netip.Addr, error) {
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, egress.ErrNoSuchHost
		}
		return nil, err
	}
	return addrs, nil
}

// EgressSuggestResult is `isopod egress suggest`'s answer.
type EgressSuggestResult struct {
	OK        bool   `json:"ok"`
	VMID      string `json:"vm_id"`
	EgressLog string `json:"egress_log_path"`
	egress.Suggestion
}

// EgressSuggest reads a filtered run's egress record and returns the
// smallest allowlist that would have allowed everything it tried.
func (s *Service) EgressSuggest(_ context.Context, vmID string) (*EgressSuggestResult, error) {
	if !validVMID(vmID) {
		return nil, fmt.Errorf("egress suggest: %q is not a VM id (want vm-XXXXXXXX, the report's vm_id): %w", vmID, errdefs.ErrInvalidArgument)
	}
	path := filepath.Join(s.opts.Paths.VM(vmID), EgressLogName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(s.opts.Paths.VM(vmID)); serr != nil {
			return nil, fmt.Errorf("egress suggest: no VM %s under %s: %w", vmID, s.opts.Paths.VMs(), errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("egress suggest: %s has no egress record; only filtered runs keep one (rerun with --deny-egress to learn an allowlist): %w", vmID, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("egress suggest: %w", err)
	}
	defer f.Close()
	events, err := flightrec.ReadEvents(f)
	if err != nil {
		return nil, err
	}
	return &EgressSuggestResult{OK: true, VMID: vmID, EgressLog: path, Suggestion: egress.Suggest(flightrec.Attempts(events))}, nil
}

// validVMID reports whether id has the form of a VM id.
func validVMID(id string) bool {
	rest, ok := strings.CutPrefix(id, "vm-")
	if !ok || len(rest) != 8 {
		return false
	}
	for _, c := range rest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
