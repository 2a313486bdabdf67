package agent

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// configureNet addresses one interface, brings it up, replaces the default
// route and writes resolvConf. cfg has passed validateNet.
func configureNet(log *slog.Logger, cfg agentproto.NetConfig, resolvConf string) error {
	ifc, err := pickInterface(cfg.Interface, cfg.MAC)
	if err != nil {
		return err
	}
	prefix := netip.MustParsePrefix(cfg.Address)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening an inet socket: %w", err)
	}
	defer unix.Close(fd)
	if err := setIfAddr(fd, ifc.Name, unix.SIOCSIFADDR, prefix.Addr()); err != nil {
		return err
	}
	mask := net.CIDRMask(prefix.Bits(), 32)
	if err := setIfAddr(fd, ifc.Name, unix.SIOCSIFNETMASK, netip.AddrFrom4([4]byte(mask))); err != nil {
		return err
	}
	if err := disableIPv6(ifc.Name); err != nil {
		return err
	}
	if err := ifUp(fd, ifc.Name); err != nil {
		return err
	}
	if cfg.Gateway != "" {
		gw := netip.MustParseAddr(cfg.Gateway)
		onlink := !prefix.Masked().Contains(gw)
		if err := replaceDefaultRoute(ifc.Index, gw, onlink); err != nil {
			return err
		}
	}
	if len(cfg.DNS) > 0 {
		if err := writeResolvConf(resolvConf, cfg.DNS); err != nil {
			return err
		}
	}
	log.Debug("interface configured", "interface", ifc.Name, "address", cfg.Address)
	return nil
}

// disableIPv6 turns IPv6 off on the interface before it comes up. The
// host's stack carries no IPv6, so the guest gets no IPv6 address, route,
// duplicate-address detection or multicast reports on it: the kernel sends
// nothing the host would only drop, and a snapshot taken right after the
// link came up leaves no address detection running in its clones. A kernel
// without IPv6 has nothing to turn off.
func disableIPv6(name string) error {
	err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", name, "disable_ipv6"), []byte("1"), 0)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("disabling IPv6 on %s: %w", name, err)
	}
	return nil
}

// pickInterface returns the named interface, else the one with mac, else
// the first interface that is not a loopback.
func pickInterface(name, mac string) (*net.Interface, error) {
	if name != "" {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, err)
		}
		return ifc, nil
	}
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	if mac != "" {
		want, _ := net.ParseMAC(mac)
		for i := range all {
			if strings.EqualFold(all[i].HardwareAddr.String(), want.String()) {
				return &all[i], nil
			}
		}
		return nil, fmt.Errorf("no interface has MAC %s", mac)
	}
	for i := range all {
		if all[i].Flags&net.FlagLoopback == 0 {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("no network interface besides loopback; is the NIC's driver loaded?")
}

func setIfAddr(fd int, name string, req uint, a netip.Addr) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("interface %q: %w", name, err)
	}
	b := a.As4()
	if err := ifr.SetInet4Addr(b[:]); err != nil {
		return fmt.Errorf("interface %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
		what := "address"
		if req == unix.SIOCSIFNETMASK {
			what = "netmask"
		}
		return fmt.Errorf("setting %s %s on %s: %w", what, a, name, err)
	}
	return nil
}

// ifUp sets IFF_UP on an interface.
func ifUp(fd int, name string) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("interface %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading flags of %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	return nil
}

// replaceDefaultRoute installs (or replaces) the IPv4 default route via gw
// on interface ifindex with one rtnetlink RTM_NEWROUTE request.
func replaceDefaultRoute(ifindex int, gw netip.Addr, onlink bool) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening rtnetlink: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("binding rtnetlink: %w", err)
	}
	msg := routeMessage(ifindex, gw, onlink)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending the default route: %w", err)
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("reading the route reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("parsing the route reply: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return fmt.Errorf("adding default route via %s: %w", gw, unix.Errno(-code))
			}
			return nil
		}
	}
}

// routeMessage encodes nlmsghdr + rtmsg + RTA_GATEWAY + RTA_OIF.
func routeMessage(ifindex int, gw netip.Addr, onlink bool) []byte {
	const attrs = 2 * (unix.SizeofRtAttr + 4)
	total := unix.SizeofNlMsghdr + unix.SizeofRtMsg + attrs
	b := make([]byte, total)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(total))
	ne.PutUint16(b[4:], unix.RTM_NEWROUTE)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	ne.PutUint32(b[8:], 1) // sequence
	r := b[unix.SizeofNlMsghdr:]
	r[0] = unix.AF_INET // family; dst_len, src_len, tos stay 0
	r[4] = unix.RT_TABLE_MAIN
	r[5] = unix.RTPROT_BOOT
	r[6] = unix.RT_SCOPE_UNIVERSE
	r[7] = unix.RTN_UNICAST
	if onlink {
		ne.PutUint32(r[8:], unix.RTNH_F_ONLINK)
	}
	a := r[unix.SizeofRtMsg:]
	ne.PutUint16(a[0:], unix.SizeofRtAttr+4)
	ne.PutUint16(a[2:], unix.RTA_GATEWAY)
	g := gw.As4()
	copy(a[4:8], g[:])
	a = a[8:]
	ne.PutUint16(a[0:], unix.SizeofRtAttr+4)
	ne.PutUint16(a[2:], unix.RTA_OIF)
	ne.PutUint32(a[4:], uint32(ifindex))
	return b
}

// writeResolvConf writes one nameserver line per server, creating the
// directory when the image has none.
func writeResolvConf(path string, servers []string) error {
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// A dangling symlink (systemd-resolved images) is replaced by a file.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		os.Remove(path)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// loopbackUp brings lo up and gives it 127.0.0.1/8 when the kernel did not.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening an inet socket: %w", err)
	}
	defer unix.Close(fd)
	if err := ifUp(fd, "lo"); err != nil {
		return err
	}
	if lo, err := net.InterfaceByName("lo"); err == nil {
		if addrs, err := lo.Addrs(); err == nil && len(addrs) > 0 {
			return nil
		}
	}
	if err := setIfAddr(fd, "lo", unix.SIOCSIFADDR, netip.AddrFrom4([4]byte{127, 0, 0, 1})); err != nil {
		return err
	}
	return setIfAddr(fd, "lo", unix.SIOCSIFNETMASK, netip.AddrFrom4([4]byte{255, 0, 0, 0}))
}
