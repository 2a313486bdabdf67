package network

import (
	"isopod/integration/e2e"
	"syscall"

	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/testnet"
)

func nsRun(t testing.TB, n *testnet.Net, args ...string) *e2e.Result {
	t.Helper()
	r := e2e.NSIsopod(t, n, append([]string{"run"}, args...)...)
	if r.Code != 0 {
		t.Fatalf("isopod run %v:\n%s", args, r)
	}
	return r
}

// netEvents reads a run's per-flow log.
func netEvents(t testing.TB, r *e2e.Result) []map[string]any {
	t.Helper()
	netb, _ := r.JSON["net"].(map[string]any)
	path, _ := netb["log_path"].(string)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("net log: %v (report %s)", err, r.Stdout)
	}
	var evs []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var ev map[string]any
		if json.Unmarshal(line, &ev) == nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

func hasEvent(evs []map[string]any, dst string, allowed bool) map[string]any {
	for _, ev := range evs {
		if ev["dst"] == dst && ev["allowed"] == allowed {
			return ev
		}
	}
	return nil
}

func TestNetworkPublicOnly(t *testing.T) {
	e2e.RequireVM(t)
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)
	n.ServeHTTP(t, n.LAN, testnet.LANIP+":80", nil)

	t.Run("wget by name through the gateway's DNS", func(t *testing.T) {
		r := nsRun(t, n, "--", "sh", "-c", "ip -4 addr show dev eth0; ip route; cat /etc/resolv.conf; nslookup test.example; wget -q -O- http://test.example"+testnet.HelloPath)
		out := e2e.Str(r.JSON, "stdout")
		for _, want := range []string{testnet.HelloBody, testnet.PublicIP, "nameserver 10.0.2.1", "inet 10.0.2.2/30", "default via 10.0.2.1"} {
			if !strings.Contains(out, want) {
				t.Errorf("guest output lacks %q:\n%s\nstderr: %s", want, out, e2e.Str(r.JSON, "stderr"))
			}
		}
		if e2e.Str(r.JSON, "guest_ip") != "10.0.2.2" {
			t.Errorf("guest_ip %q; want 10.0.2.2", e2e.Str(r.JSON, "guest_ip"))
		}
		netb, _ := r.JSON["net"].(map[string]any)
		if netb["flows"].(float64) < 2 || netb["bytes_down"].(float64) < float64(len(testnet.HelloBody)) {
			t.Errorf("net block: %v", netb)
		}
		if hasEvent(netEvents(t, r), testnet.PublicIP, true) == nil {
			t.Errorf("no allowed flow to %s recorded", testnet.PublicIP)
		}
	})

	t.Run("metadata and LAN refused and recorded", func(t *testing.T) {
		start := time.Now()
		r := nsRun(t, n, "--", "sh", "-c",
			"wget -q -O- http://"+testnet.MetadataIP+"/ ; echo meta=$?; wget -q -O- http://"+testnet.LANIP+"/hello ; echo lan=$?")
		out := e2e.Str(r.JSON, "stdout")
		if !strings.Contains(out, "meta=1") || !strings.Contains(out, "lan=1") {
			t.Errorf("refused connections did not fail: %q %q", out, e2e.Str(r.JSON, "stderr"))
		}
		if time.Since(start) > 30*time.Second {
			t.Errorf("refusals took %v: they must fail fast", time.Since(start))
		}
		evs := netEvents(t, r)
		for _, dst := range []string{testnet.MetadataIP, testnet.LANIP} {
			if ev := hasEvent(evs, dst, false); ev == nil || ev["reason"] == "" {
				t.Errorf("no refusal of %s recorded: %v", dst, evs)
			}
		}
	})

	t.Run("allow-lan-egress reaches the LAN host", func(t *testing.T) {
		r := nsRun(t, n, "--allow-lan-egress", "--", "wget", "-q", "-O-", "http://"+testnet.LANIP+testnet.HelloPath)
		if e2e.Str(r.JSON, "stdout") != testnet.HelloBody {
			t.Errorf("LAN fetch: %s", r.Stdout)
		}
	})

	t.Run("IPv6 is off on the NIC, cold and warm", func(t *testing.T) {
		// Cold (an explicit scratch size is never resumed) and the default
		// path, which resumes from the warm pool once it is built.
		for _, args := range [][]string{{"--scratch-mib", "1024"}, nil, nil} {
			argv := append(append([]string(nil), args...), "--", "sh", "-c",
				"cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6; ip -6 addr show dev eth0; "+
					`awk '$1 == "Ip6OutRequests" || $1 == "Icmp6OutMsgs" { print $1 "=" $2 }' /proc/net/dev_snmp6/eth0`)
			r := nsRun(t, n, argv...)
			want := "1\nIp6OutRequests=0\nIcmp6OutMsgs=0\n"
			if out := e2e.Str(r.JSON, "stdout"); out != want {
				t.Errorf("%s run: guest IPv6 state %q (stderr %q); want %q",
					e2e.Str(r.JSON, "path"), out, e2e.Str(r.JSON, "stderr"), want)
			}
		}
	})

	t.Run("no-network has only lo", func(t *testing.T) {
		r := nsRun(t, n, "--no-network", "--", "ls", "/sys/class/net")
		if e2e.Str(r.JSON, "stdout") != "lo\n" {
			t.Errorf("interfaces: %q", e2e.Str(r.JSON, "stdout"))
		}
		if r.JSON["net"] != nil || r.JSON["guest_ip"] != nil {
			t.Errorf("a --no-network run reports a network: %s", r.Stdout)
		}
	})

	t.Run("four networked runs in parallel", func(t *testing.T) {
		rs := e2e.Parallel(4, func(int) *e2e.Result {
			return e2e.NSIsopod(t, n, "run", "--", "wget", "-q", "-O-", "http://test.example"+testnet.HelloPath)
		})
		for i, r := range rs {
			if r.Code != 0 || e2e.Str(r.JSON, "stdout") != testnet.HelloBody {
				t.Errorf("run %d:\n%s", i, r)
			}
		}
	})

	t.Run("100 MiB download hashes right", func(t *testing.T) {
		r := nsRun(t, n, "--timeout-s", "600", "--", "sh", "-c", "wget -q -O- http://test.example"+testnet.BigPath+" | sha256sum")
		if !strings.HasPrefix(e2e.Str(r.JSON, "stdout"), testnet.BigSHA256()) {
			t.Errorf("guest sha256 %q; want %s", e2e.Str(r.JSON, "stdout"), testnet.BigSHA256())
		}
		netb, _ := r.JSON["net"].(map[string]any)
		if netb["bytes_down"].(float64) < testnet.BigSize {
			t.Errorf("bytes_down %v < %d", netb["bytes_down"], testnet.BigSize)
		}
	})

	t.Run("curl on base-debian", func(t *testing.T) {
		e2e.RequireDebian(t)
		r := nsRun(t, n, "--base", "base-debian", "--", "curl", "-sS", "http://test.example"+testnet.HelloPath)
		if e2e.Str(r.JSON, "stdout") != testnet.HelloBody {
			t.Errorf("curl: %s", r.Stdout)
		}
	})
}

func TestGuestsCannotReachEachOther(t *testing.T) {
	e2e.RequireVM(t)
	// Guest A listens on an extra address of a shared /24; guest B, running
	// at the same time, takes another address of it and tries A's, the
	// gateway and the broadcast address. On one shared link B would reach
	// A; with a stack of its own per VM nothing answers.
	a := exec.Command(filepath.Join(e2e.BinDir, "isopod"), "run", "--timeout-s", "60", "--", "sh", "-c",
		"ip addr add 10.0.2.200/24 dev eth0 && echo ready && nc -l -p 8080 -e echo reached-a")
	var aout bytes.Buffer
	a.Stdout = &aout
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Process.Signal(syscall.SIGTERM); a.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	ready := false
	for !ready && time.Now().Before(deadline) {
		if vm := e2e.VMOfOwner(a.Process.Pid); vm != "" {
			b, _ := os.ReadFile(filepath.Join(e2e.HomeDir, "vms", vm, "stdout.log"))
			ready = bytes.Contains(b, []byte("ready"))
		}
		if !ready {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if !ready {
		t.Fatalf("guest A never listened; its report: %s", aout.String())
	}
	r := e2e.Run(t, "--", "sh", "-c", "ip addr add 10.0.2.201/24 dev eth0; for h in 10.0.2.200 10.0.2.1 10.0.2.255; do nc -w 2 $h 8080 </dev/null; echo $h=$?; done")
	out := e2e.Str(r.JSON, "stdout")
	if strings.Contains(out, "reached-a") || strings.Count(out, "=1") != 3 {
		t.Errorf("guest B reached something: %q", out)
	}
}
