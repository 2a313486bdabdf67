package integration

import "testing"

func TestZZDebug(t *testing.T) {
	requireVM(t)
	n := egressFixture(t)
	r := egIsopod(t, n, "run", "--allow-host", "test.example", "--", "sh", "-c", "sysctl -w net.ipv6.conf.eth0.accept_dad=0; ip -6 addr add 2001:db8::2/64 dev eth0; echo a=$?; timeout 3 nc -w 2 2001:db8::10 80 </dev/null; echo rc=$?")
	t.Logf("%s", r.Stdout)
}
