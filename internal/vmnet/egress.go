package vmnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"isopod/internal/credential"
	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/proxy"
	"isopod/internal/netstack"
)

// Gateway ports of the proxy-aware path of filtered egress.
const (
	HTTPProxyPort = 3128
	SOCKSPort     = 1080
	// EgressLogName is the flight recorder's file in a filtered VM's
	// directory.
	EgressLogName = "egress.jsonl"
)

// startFiltered starts a filtered network: the stack with the
// Filter over rules as its policy, sniffer and DNS resolver, the flight recorder
// writing egress.jsonl, the HTTP and SOCKS5 proxies on the gateway, and,
// when the run injects credentials, their endpoint (credentials.go).
// Rolls back on failure.
func startFiltered(cfg Config) (*Network, error) {
	n := &Network{mode: flightrec.ModeFiltered}
	ok := false
	defer func() {
		if !ok {
			n.Close()
		}
	}()
	hostAddrs, err := netstack.HostAddrs()
	if err != nil {
		return nil, err
	}
	sock, err := takeNIC(cfg.Scope, cfg.ID, cfg.NIC)
	n.sockDir, n.ln = sock.dir, sock.ln
	if err != nil {
		return nil, err
	}
	n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(cfg.Dir, EgressLogName), Start: cfg.Start,
		Mode: flightrec.ModeFiltered, Rules: cfg.Rules, Logger: cfg.Logger, Continue: cfg.Continue})
	if err != nil {
		return nil, err
	}
	if n.creds, err = newCredentials(cfg.Credentials, n.rec, cfg); err != nil {
		return nil, err
	}
	pins, err := n.creds.pins(lookupIPv4)
	if err != nil {
		return nil, err
	}
	n.filter, err = egress.NewFilter(egress.FilterConfig{Rules: cfg.Rules, HostAddrs: hostAddrs, Lookup: lookupIPv4, Pinned: pins})
	if err != nil {
		return nil, err
	}
	n.stack, err = netstack.Start(netstack.Config{
		Socket:   sock.path(),
		Listener: sock.ln,
		Policy:   n.filter,
		DNS:      netstack.ResolverHandler(n.filter),
		Recorder: n.rec,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the network stack: %w", err)
	}
	if err := n.serveGateway(cfg); err != nil {
		return nil, err
	}
	ok = true
	return n, nil
}

// serveGateway serves the gateway's HTTP and SOCKS5 proxies, and the
// credential endpoint when there is one, and sets the guest's environment
// that points at them.
func (n *Network) serveGateway(cfg Config) error {
	gateway := n.stack.NetConfig().Gateway
	pcfg := proxy.Config{Filter: n.filter, Recorder: n.rec, Dial: (&net.Dialer{}).DialContext, Logger: cfg.Logger}
	if n.creds != nil {
		gw, err := netip.ParseAddr(gateway)
		if err != nil {
			return fmt.Errorf("the gateway's address %q: %w", gateway, err)
		}
		pcfg.Credential, pcfg.CredentialAddr = n.creds.gw, netip.AddrPortFrom(gw, credential.EndpointPort)
	}
	var err error
	if n.proxy, err = proxy.New(pcfg); err != nil {
		return err
	}
	httpL, err := n.stack.ListenTCP(HTTPProxyPort)
	if err != nil {
		return err
	}
	socksL, err := n.stack.ListenTCP(SOCKSPort)
	if err != nil {
		return err
	}
	// The servers hold their own copy: Close clears n.proxy, and may run
	// before they start.
	px := n.proxy
	go func() {
		if err := px.ServeHTTPProxy(httpL); err != nil {
			cfg.Logger.Debug("http proxy ended", "err", err)
		}
	}()
	go func() {
		if err := px.ServeSOCKS(socksL); err != nil {
			cfg.Logger.Debug("socks proxy ended", "err", err)
		}
	}()
	if n.creds == nil {
		n.env = ProxyEnv(gateway)
		return nil
	}
	credL, err := n.stack.ListenTCP(credential.EndpointPort)
	if err != nil {
		return err
	}
	n.creds.serve(credL, gateway, cfg.Logger)
	n.env = append(ProxyEnv(gateway, gateway), credential.EndpointEnv+"="+n.creds.endpoint)
	return nil
}

// ProxyEnv is the environment a filtered VM's commands get: the gateway's
// HTTP proxy for http and https, its SOCKS5 proxy (names resolved by the
// proxy) for everything else, in both upper and lower case. NO_PROXY
// names loopback and the hosts in direct (the gateway, when it serves
// the credential endpoint).
func ProxyEnv(gateway string, direct ...string) []string {
	httpProxy := "http://" + net.JoinHostPort(gateway, strconv.Itoa(HTTPProxyPort))
	socks := "socks5h://" + net.JoinHostPort(gateway, strconv.Itoa(SOCKSPort))
	noProxy := strings.Join(append([]string{"localhost", "127.0.0.1", "::1"}, direct...), ",")
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
