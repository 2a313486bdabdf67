package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// errNoSystem refuses machine operations when the agent was given no System.
var errNoSystem = fmt.Errorf("machine operations are available only when the agent runs as the guest's PID 1: %w", errdefs.ErrNotSupported)

func (c *conn) system() (System, error) {
	if c.srv.opts.System == nil {
		return nil, errNoSystem
	}
	return c.srv.opts.System, nil
}

// validateNet checks a NetConfig before anything on the machine changes.
func validateNet(n *agentproto.NetConfig) error {
	if n == nil {
		return errors.New("configure_net: no net config in the request")
	}
	p, err := netip.ParsePrefix(n.Address)
	if err != nil {
		return fmt.Errorf("configure_net: address %q: want an IPv4 CIDR such as 10.0.2.15/24: %w", n.Address, err)
	}
	if !p.Addr().Is4() {
		return fmt.Errorf("configure_net: address %q: only IPv4 is supported", n.Address)
	}
	if n.Gateway != "" {
		gw, err := netip.ParseAddr(n.Gateway)
		if err != nil || !gw.Is4() {
			return fmt.Errorf("configure_net: gateway %q: want an IPv4 address", n.Gateway)
		}
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("configure_net: dns server %q: want an IP address", d)
		}
	}
	if n.MAC != "" {
		if _, err := net.ParseMAC(n.MAC); err != nil {
			return fmt.Errorf("configure_net: mac %q: %w", n.MAC, err)
		}
	}
	if strings.ContainsAny(n.Interface, "/\x00") || len(n.Interface) >= 16 {
		return fmt.Errorf("configure_net: interface %q: not a valid interface name", n.Interface)
	}
	for _, kv := range n.Env {
		if err := agentproto.ValidEnv(kv); err != nil {
			return fmt.Errorf("configure_net: %w", err)
		}
	}
	return nil
}

func (c *conn) configureNet(m *agentproto.Msg) {
	if err := validateNet(m.Net); err != nil {
		c.replyErr(m.ID, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument))
		return
	}
	sys, err := c.system()
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("configure_net: %w", err))
		return
	}
	// A clone resumed from a snapshot is sent the configuration its
	// snapshot already applied (every run's private network looks the
	// same). Re-addressing the interface would drop and re-add the address
	// and its routes for nothing, so only the env changes then.
	want := *m.Net
	want.Env = nil
	c.srv.mu.Lock()
	inForce := c.srv.netApplied != nil && sameNet(*c.srv.netApplied, want)
	c.srv.mu.Unlock()
	if !inForce {
		if err := sys.ConfigureNet(*m.Net); err != nil {
			// The interface may be half configured now: nothing is known
			// to be in force.
			c.srv.mu.Lock()
			c.srv.netApplied = nil
			c.srv.mu.Unlock()
			c.log.Error("configure_net failed", "err", err)
			c.replyErr(m.ID, fmt.Errorf("configure_net: %w", err))
			return
		}
	}
	c.srv.mu.Lock()
	c.srv.netApplied = &want
	c.srv.netEnv = append([]string(nil), m.Net.Env...)
	c.srv.mu.Unlock()
	// A clone's network was in force already: nothing to tell its console.
	level := slog.LevelInfo
	if inForce {
		level = slog.LevelDebug
	}
	c.log.Log(context.Background(), level, "network configured", "address", m.Net.Address, "gateway", m.Net.Gateway, "already_in_force", inForce)
	c.replyOK(m.ID)
}

// sameNet reports whether two network configurations (env aside) are the
// same.
func sameNet(a, b agentproto.NetConfig) bool {
	return a.Interface == b.Interface && a.Address == b.Address && a.Gateway == b.Gateway &&
		a.MAC == b.MAC && slices.Equal(a.DNS, b.DNS)
}

func (c *conn) syncClock(m *agentproto.Msg) {
	if m.Clock == nil || m.Clock.UnixNano <= 0 {
		c.replyErr(m.ID, fmt.Errorf("sync_clock: want clock.unix_nano > 0: %w", errdefs.ErrInvalidArgument))
		return
	}
	sys, err := c.system()
	if err == nil {
		err = sys.SetClock(time.Unix(0, m.Clock.UnixNano))
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("sync_clock: %w", err))
		return
	}
	c.replyOK(m.ID)
}

// validHostname checks a name for sethostname.
func validHostname(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("hostname is empty: %w", errdefs.ErrInvalidArgument)
	case len(name) > agentproto.MaxHostname:
		return fmt.Errorf("hostname is %d bytes; the limit is %d: %w", len(name), agentproto.MaxHostname, errdefs.ErrInvalidArgument)
	case strings.ContainsAny(name, "\x00/ \t\n"):
		return fmt.Errorf("hostname %q contains NUL, '/' or white space: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (c *conn) setHostname(m *agentproto.Msg) {
	err := validHostname(m.Hostname)
	var sys System
	if err == nil {
		sys, err = c.system()
	}
	if err == nil {
		err = sys.SetHostname(m.Hostname)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("set_hostname: %w", err))
		return
	}
	c.replyOK(m.ID)
}

func (c *conn) addEntropy(m *agentproto.Msg, seed []byte) {
	if len(seed) == 0 {
		c.replyErr(m.ID, fmt.Errorf("add_entropy: the payload is empty; send random bytes: %w", errdefs.ErrInvalidArgument))
		return
	}
	sys, err := c.system()
	if err == nil {
		err = sys.AddEntropy(seed)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("add_entropy: %w", err))
		return
	}
	c.replyOK(m.ID)
}

// bootIDRE is a boot id as the kernel writes one.
var bootIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func (c *conn) setBootID(m *agentproto.Msg) {
	var err error
	if !bootIDRE.MatchString(m.BootID) {
		err = fmt.Errorf("boot id %q is not a lowercase UUID: %w", m.BootID, errdefs.ErrInvalidArgument)
	}
	var sys System
	if err == nil {
		sys, err = c.system()
	}
	if err == nil {
		err = sys.SetBootID(m.BootID)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("set_boot_id: %w", err))
		return
	}
	c.replyOK(m.ID)
}
