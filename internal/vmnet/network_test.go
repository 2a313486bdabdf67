package vmnet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// privateSockets points SocketBase at a directory of the test's own.
func privateSockets(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	return tmp
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// TestNetworkNAT: a NAT network serves a socket in its own private
// directory, logs to net.jsonl, has no egress block and no proxy
// environment, and Close removes its sockets, twice over.
func TestNetworkNAT(t *testing.T) {
	privateSockets(t)
	dir := t.TempDir()
	n, err := Start(Config{Scope: "s1", ID: "vm-nat", Dir: dir, Start: time.Now()})
	if err != nil {
		t.Fatalf("StartNetwork: %v", err)
	}
	sock := n.VMMNet().Socket
	if !exists(sock) || n.VMMNet().MAC == "" {
		t.Errorf("NIC %+v: socket missing or no MAC", n.VMMNet())
	}
	if st, err := os.Stat(filepath.Dir(sock)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory: %v %v; want mode 0700", st, err)
	}
	if n.Mode() != flightrec.ModeNAT || n.LogPath() != filepath.Join(dir, "net.jsonl") || n.EgressReport() != nil {
		t.Errorf("mode %q, log %q, egress %v; want nat, net.jsonl, no egress block", n.Mode(), n.LogPath(), n.EgressReport())
	}
	ac := n.AgentConfig()
	if ac == nil || slices.ContainsFunc(ac.Env, func(e string) bool { return len(e) > 10 && e[:10] == "HTTP_PROXY" }) {
		t.Errorf("agent config %+v: a NAT network sets no proxy", ac)
	}
	if _, err := netip.ParseAddr(n.GuestIP()); err != nil {
		t.Errorf("guest IP %q: %v", n.GuestIP(), err)
	}
	if tot := n.Totals(); tot.Flows != 0 {
		t.Errorf("totals before any flow: %+v", tot)
	}
	n.Close()
	n.Close()
	if exists(filepath.Dir(sock)) {
		t.Errorf("socket directory %s left after Close", filepath.Dir(sock))
	}
	if !exists(filepath.Join(dir, "net.jsonl")) {
		t.Errorf("flow log removed by Close")
	}
}

// TestNetworkFiltered: a filtered network logs to egress.jsonl, reports
// an egress block with its rules, and gives commands the gateway's
// proxies.
func TestNetworkFiltered(t *testing.T) {
	privateSockets(t)
	rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n, err := Start(Config{Scope: "s1", ID: "vm-filt", Dir: dir, Rules: rules, Start: time.Now()})
	if err != nil {
		t.Fatalf("StartNetwork: %v", err)
	}
	sock := n.VMMNet().Socket
	if n.Mode() != flightrec.ModeFiltered || n.LogPath() != filepath.Join(dir, EgressLogName) || n.EgressReport() == nil {
		t.Errorf("mode %q, log %q, egress %v; want filtered, %s, an egress block", n.Mode(), n.LogPath(), n.EgressReport(), EgressLogName)
	}
	ac := n.AgentConfig()
	for _, want := range ProxyEnv(ac.Gateway) {
		if !slices.Contains(ac.Env, want) {
			t.Errorf("agent env %v lacks %s", ac.Env, want)
		}
	}
	n.Close()
	n.Close()
	if exists(filepath.Dir(sock)) {
		t.Errorf("socket directory left after Close")
	}
}

// TestParkedNIC: a parked NIC's socket exists before the network; the
// network takes it (the NIC is then empty, and its Close touches nothing)
// and serves the same path; a parked NIC no network took is removed by
// its Close.
func TestParkedNIC(t *testing.T) {
	privateSockets(t)
	nic, err := ParkNIC("s1", "vm-park")
	if err != nil {
		t.Fatalf("ParkNIC: %v", err)
	}
	path := nic.VMMNet().Socket
	if !exists(path) {
		t.Fatalf("parked socket %s missing", path)
	}
	if _, err := ParkNIC("s1", "vm-park"); err == nil {
		t.Errorf("a second NIC of the same id was parked")
	}
	n, err := Start(Config{Scope: "s1", ID: "vm-park", Dir: t.TempDir(), NIC: nic})
	if err != nil {
		t.Fatalf("StartNetwork: %v", err)
	}
	if n.VMMNet().Socket != path {
		t.Errorf("network serves %s; want the parked %s", n.VMMNet().Socket, path)
	}
	nic.Close()
	if !exists(path) {
		t.Errorf("closing a taken NIC removed the network's socket")
	}
	n.Close()
	if exists(filepath.Dir(path)) {
		t.Errorf("socket directory left after Close")
	}

	idle, err := ParkNIC("s1", "vm-idle")
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Dir(idle.VMMNet().Socket)
	idle.Close()
	idle.Close()
	if exists(d) {
		t.Errorf("unused parked NIC's directory %s left after Close", d)
	}
}

// TestNetworkRollsBack: a network that cannot start leaves no socket
// directory behind.
func TestNetworkRollsBack(t *testing.T) {
	tmp := privateSockets(t)
	_, err := Start(Config{Scope: "s1", ID: "vm-bad", Dir: filepath.Join(t.TempDir(), "missing")})
	if err == nil {
		t.Fatal("StartNetwork with a missing VM directory succeeded")
	}
	if exists(filepath.Join(tmp, fmt.Sprintf("isopod-%d", os.Getuid()), "s1", "vm-bad")) {
		t.Errorf("socket directory left after a failed start")
	}
}

// TestLookupIPv4: an allowed name resolves through the host's resolver
// (the filter unmaps what it gets).
func TestLookupIPv4(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := lookupIPv4(ctx, "localhost")
	if err != nil || !slices.ContainsFunc(addrs, func(a netip.Addr) bool { return a.Unmap() == netip.MustParseAddr("127.0.0.1") }) {
		t.Errorf("lookupIPv4(localhost) = %v, %v; want 127.0.0.1", addrs, err)
	}
}

// TestSocketBaseGoesWhenEmpty: a state root's socket directory is removed
// with its last run's, stays while another run's is there, and runs that
// start and end at once never find it gone under them.
func TestSocketBaseGoesWhenEmpty(t *testing.T) {
	privateSockets(t)
	a, err := ParkNIC("s2", "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParkNIC("s2", "vm-b")
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(filepath.Dir(a.VMMNet().Socket))
	a.Close()
	if !exists(base) {
		t.Fatalf("%s went while another run's directory was in it", base)
	}
	b.Close()
	if exists(base) {
		t.Errorf("%s left after its last run's directory went", base)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				n, err := ParkNIC("s2", fmt.Sprintf("vm-%d-%d", g, i))
				if err != nil {
					t.Errorf("ParkNIC while others end: %v", err)
					return
				}
				n.Close()
			}
		}()
	}
	wg.Wait()
	if exists(base) {
		t.Errorf("%s left after every run ended", base)
	}
}
