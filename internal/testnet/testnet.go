// Package testnet builds throwaway network namespaces for tests that need a
// real network: an "isopod host" namespace where the code under test runs,
// and test hosts at documentation addresses (which isopod's egress policy
// counts as public) and at a private address, all joined through a router
// namespace. Nothing in it routes to the machine's real network, so no test
// packet leaves the machine.
//
//	Host    192.0.2.2/24      default route via the router; resolver = DNS on Public
//	Public  203.0.113.10/24   DNS server (:53), HTTP servers; also owns 169.254.169.254
//	Public2 198.51.100.10/24
//	LAN     192.168.77.10/24  a private address
//
// Code runs in a namespace in one of two ways:
//   - Sockets: [Net.Listen] and [Net.ListenPacket] create a socket inside a
//     namespace from a throwaway OS thread; the socket stays in that
//     namespace and can be served from any goroutine.
//   - Processes: [Net.Command] enters a namespace the way "ip netns exec"
//     does, binding /etc/netns/<name>/resolv.conf over /etc/resolv.conf so
//     that Go's resolver in the child uses the test DNS server, but keeps
//     the host's /sys. [Net.RunSelf] re-executes the
//     running test binary for the current test inside a namespace; the test
//     checks [IsChild] to know which side it is on.
//
// Everything is removed in t.Cleanup. New needs root and skips otherwise,
// and always skips under -short.
package testnet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses in the test network.
const (
	HostIP     = "192.0.2.2"
	RouterIP   = "192.0.2.1" // the Host namespace's gateway
	PublicIP   = "203.0.113.10"
	Public2IP  = "198.51.100.10"
	LANIP      = "192.168.77.10"
	MetadataIP = "169.254.169.254" // answered by the Public namespace
)

// ChildEnv marks a process started by [Net.RunSelf].
const ChildEnv = "ISOPOD_TESTNET_CHILD"

// IsChild reports whether this process is a test re-executed by RunSelf
// inside a namespace.
func IsChild() bool { return os.Getenv(ChildEnv) == "1" }

// Net is one test network. Field values are namespace names.
type Net struct {
	Host, Router, Public, Public2, LAN string

	t   testing.TB
	dns *dnsServer
}

// New builds a fresh test network, starts its DNS server and registers its
// removal with t.Cleanup.
func New(t testing.TB) *Net {
	t.Helper()
	if testing.Short() {
		t.Skip("testnet builds network namespaces; skipped under -short")
	}
	if IsChild() {
		t.Fatal("testnet.New called inside a RunSelf child; check testnet.IsChild first")
	}
	if os.Geteuid() != 0 {
		t.Skip("testnet needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("testnet needs iproute2's ip command: ", err)
	}
	var rnd [3]byte
	rand.Read(rnd[:])
	p := "isp" + hex.EncodeToString(rnd[:])
	n := &Net{Host: p + "-host", Router: p + "-rtr", Public: p + "-pub", Public2: p + "-pub2", LAN: p + "-lan", t: t}

	if err := ip("netns", "add", n.Host); err != nil {
		t.Skip("cannot create network namespaces here: ", err)
	}
	t.Cleanup(n.teardown)
	for _, ns := range []string{n.Router, n.Public, n.Public2, n.LAN} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
	}
	type leg struct {
		ns, veth, addr, routerAddr string
	}
	legs := []leg{
		{n.Host, p + "h", HostIP + "/24", RouterIP + "/24"},
		{n.Public, p + "p", PublicIP + "/24", "203.0.113.1/24"},
		{n.Public2, p + "q", Public2IP + "/24", "198.51.100.1/24"},
		{n.LAN, p + "l", LANIP + "/24", "192.168.77.1/24"},
	}
	steps := [][]string{
		{"-n", n.Router, "link", "set", "lo", "up"},
	}
	for _, l := range legs {
		gw, _, _ := strings.Cut(l.routerAddr, "/")
		steps = append(steps,
			[]string{"link", "add", l.veth, "netns", l.ns, "type", "veth", "peer", "name", l.veth + "r", "netns", n.Router},
			[]string{"-n", l.ns, "link", "set", "lo", "up"},
			[]string{"-n", l.ns, "addr", "add", l.addr, "dev", l.veth},
			[]string{"-n", l.ns, "link", "set", l.veth, "up"},
			[]string{"-n", l.ns, "route", "add", "default", "via", gw},
			[]string{"-n", n.Router, "addr", "add", l.routerAddr, "dev", l.veth + "r"},
			[]string{"-n", n.Router, "link", "set", l.veth + "r", "up"},
		)
	}
	steps = append(steps,
		[]string{"-n", n.Public, "addr", "add", MetadataIP + "/32", "dev", "lo"},
		[]string{"-n", n.Router, "route", "add", MetadataIP + "/32", "via", PublicIP},
	)
	for _, s := range steps {
		if err := ip(s...); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("ip", "netns", "exec", n.Router, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("enabling forwarding in the router namespace: %v: %s", err, out)
	}

	dir := filepath.Join("/etc/netns", n.Host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+PublicIP+"\noptions timeout:2 attempts:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.dns = n.startDNS(t)
	return n
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func (n *Net) teardown() {
	for _, ns := range []string{n.Host, n.Router, n.Public, n.Public2, n.LAN} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); errors.Is(err, fs.ErrNotExist) {
			continue // never made, or gone already
		}
		if err := ip("netns", "del", ns); err != nil {
			n.t.Errorf("testnet teardown: %v", err)
		}
	}
	if err := os.RemoveAll(filepath.Join("/etc/netns", n.Host)); err != nil {
		n.t.Errorf("testnet teardown: %v", err)
	}
}

// AddAddress gives namespace ns (Public, Public2 or LAN) one more address,
// routed to it from the other namespaces, until t ends (the namespaces go
// with it).
func (n *Net) AddAddress(ns, addr string) error {
	via := map[string]string{n.Public: PublicIP, n.Public2: Public2IP, n.LAN: LANIP}[ns]
	if via == "" {
		return fmt.Errorf("testnet: no extra addresses for namespace %s", ns)
	}
	if err := ip("-n", ns, "addr", "add", addr+"/32", "dev", "lo"); err != nil {
		return err
	}
	return ip("-n", n.Router, "route", "add", addr+"/32", "via", via)
}

// Command returns a command that runs name inside namespace ns, with the
// files of /etc/netns/<ns>/ bound over /etc's in a mount namespace of its
// own, as "ip netns exec" does. Unlike "ip netns exec" it keeps the host's
// /sys, cgroup hierarchies included: isopod's VMM jail makes its cgroups
// there.
func (n *Net) Command(ns, name string, args ...string) *exec.Cmd {
	const script = `for f in /etc/netns/"$0"/*; do [ -e "$f" ] && mount --bind "$f" "/etc/${f##*/}"; done; ` +
		`exec nsenter --net=/run/netns/"$0" -- "$@"`
	return exec.Command("unshare", append([]string{"--mount", "--propagation", "slave", "--", "sh", "-c", script, ns, name}, args...)...)
}

// inNS runs fn on a fresh OS thread switched into namespace ns. The thread
// is never unlocked, so the runtime discards it when fn returns and no other
// goroutine ever runs in the namespace by accident.
func inNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening namespace %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a stream listener inside namespace ns.
func (n *Net) Listen(ns, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNS(ns, func() (err error) { l, err = net.Listen(network, addr); return err })
	return l, err
}

// ListenPacket opens a packet socket inside namespace ns.
func (n *Net) ListenPacket(ns, network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := inNS(ns, func() (err error) { c, err = net.ListenPacket(network, addr); return err })
	return c, err
}

// Dial connects from inside namespace ns (the socket stays there).
func (n *Net) Dial(ns, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() (err error) { c, err = net.DialTimeout(network, addr, timeout); return err })
	return c, err
}

// RunSelf re-executes the running test binary for t's test inside namespace
// ns, with ChildEnv=1 and env added, and fails t unless that test passes
// there. The child's output is logged. timeout bounds the child; it is
// killed (by pid) when it runs over or when t ends first.
func (n *Net) RunSelf(t *testing.T, ns string, timeout time.Duration, env ...string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := n.Command(ns, exe, "-test.run="+runPattern(t.Name()), "-test.v", "-test.count=1",
		"-test.timeout="+timeout.String())
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	cmd.Env = append(append(os.Environ(), ChildEnv+"=1"), env...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("child in %s:\n%s", ns, out.String())
	if ctx.Err() != nil {
		t.Fatalf("child test ran over %v", timeout)
	}
	if err != nil {
		t.Fatalf("child test failed: %v", err)
	}
	if !strings.Contains(out.String(), "--- PASS: "+t.Name()) {
		t.Fatalf("child did not run and pass %s", t.Name())
	}
}

// runPattern turns a test name into a -test.run pattern matching it alone.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
