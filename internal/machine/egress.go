package machine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

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
// writing egress.jsonl, and the HTTP and SOCKS5 proxies on the gateway.
// Rolls back on failure.
func startFiltered(cfg NetConfig) (*Network, error) {
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
	n.filter, err = egress.NewFilter(egress.FilterConfig{Rules: cfg.Rules, HostAddrs: hostAddrs, Lookup: lookupIPv4})
	if err != nil {
		return nil, err
	}
	sock, err := takeNIC(cfg.Scope, cfg.ID, cfg.NIC)
	n.sockDir, n.ln = sock.dir, sock.ln
	if err != nil {
		return nil, err
	}
	n.rec, err = flightrec.Open(flightrec.Config{Path: filepath.Join(cfg.Dir, EgressLogName), Start: cfg.Start,
		Mode: flightrec.ModeFiltered, Rules: cfg.Rules, Logger: cfg.Logger})
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
	n.proxy, err = proxy.New(proxy.Config{Filter: n.filter, Recorder: n.rec,
		Dial: (&net.Dialer{}).DialContext, Logger: cfg.Logger})
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
	n.env = ProxyEnv(n.stack.NetConfig().Gateway)
	ok = true
	return n, nil
}

// ProxyEnv is the environment a filtered VM's commands get: the gateway's
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
