package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

const nsModeEnv = "ISOPOD_AGENT_TEST_NAMESPACES"

// runInNamespaces runs in a copy of the test binary started in fresh UTS and
// network namespaces, where the real hostname and network code can change
// things without touching the host. It prints what failed and returns 1.
func runInNamespaces() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
		return 1
	}
	sys := &linuxSystem{log: discardLogger()}
	if err := sys.SetHostname("isopod-ns-test"); err != nil {
		return fail("SetHostname: %v", err)
	}
	var u unix.Utsname
	unix.Uname(&u)
	if got := unix.ByteSliceToString(u.Nodename[:]); got != "isopod-ns-test" {
		return fail("hostname is %q after SetHostname", got)
	}
	if err := loopbackUp(); err != nil {
		return fail("loopbackUp: %v", err)
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil || lo.Flags&net.FlagUp == 0 {
		return fail("lo after loopbackUp: %+v %v", lo, err)
	}
	// The fresh namespace has only lo; address it as if it were the NIC.
	resolv := filepath.Join(os.Getenv("ISOPOD_AGENT_TEST_DIR"), "resolv.conf")
	cfg := agentproto.NetConfig{Interface: "lo", Address: "10.0.2.15/24", Gateway: "10.0.2.2", DNS: []string{"10.0.2.3"}}
	if err := validateNet(&cfg); err != nil {
		return fail("validateNet: %v", err)
	}
	if err := configureNet(discardLogger(), cfg, resolv); err != nil {
		return fail("configureNet: %v", err)
	}
	addrs, _ := lo.Addrs()
	found := false
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.String() == "10.0.2.15/24" {
			found = true
		}
	}
	if !found {
		return fail("lo addresses after configureNet: %v", addrs)
	}
	routes, _ := os.ReadFile("/proc/net/route")
	// Default route: destination 00000000, gateway 10.0.2.2 in host order.
	if !strings.Contains(string(routes), "\t00000000\t0202000A\t") {
		return fail("no default route via 10.0.2.2:\n%s", routes)
	}
	// Replacing it works too (the old default is not left behind).
	cfg.Gateway = "10.0.2.1"
	if err := configureNet(discardLogger(), cfg, resolv); err != nil {
		return fail("configureNet again: %v", err)
	}
	routes, _ = os.ReadFile("/proc/net/route")
	if strings.Contains(string(routes), "0202000A") || !strings.Contains(string(routes), "0102000A") {
		return fail("default route not replaced:\n%s", routes)
	}
	return 0
}

func TestLinuxSystemInNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root to create UTS and network namespaces; skipped in -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create UTS and network namespaces")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nsModeEnv+"=1", "ISOPOD_AGENT_TEST_DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	var errno syscall.Errno
	if errors.As(err, &errno) && errno == syscall.EPERM {
		t.Skip("creating namespaces is not permitted here")
	}
	if err != nil {
		t.Fatalf("in namespaces: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "resolv.conf"))
	if err != nil || string(b) != "nameserver 10.0.2.3\n" {
		t.Errorf("resolv.conf = %q, %v", b, err)
	}
}
