package testnet

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// DefaultRecords are what the test DNS server answers from the start.
var DefaultRecords = []string{
	"test.example. 60 IN A " + PublicIP,
	"two.example. 60 IN A " + Public2IP,
	"lan.example. 60 IN A " + LANIP,
	"meta.example. 60 IN A " + MetadataIP,
	`test.example. 60 IN TXT "isopod testnet"`,
}

// dnsServer is an authoritative-only server for the test network: it
// answers from its records and says NXDOMAIN to everything else.
type dnsServer struct {
	mu      sync.Mutex
	records map[string][]dns.RR // key: lower-case FQDN
	queries int
}

// startDNS serves DNS on PublicIP:53 (UDP and TCP) in the Public namespace.
func (n *Net) startDNS(t testing.TB) *dnsServer {
	t.Helper()
	d := &dnsServer{records: make(map[string][]dns.RR)}
	for _, r := range DefaultRecords {
		if err := d.add(r); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := n.ListenPacket(n.Public, "udp", PublicIP+":53")
	if err != nil {
		t.Fatal(err)
	}
	l, err := n.Listen(n.Public, "tcp", PublicIP+":53")
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	servers := []*dns.Server{{PacketConn: pc, Handler: d}, {Listener: l, Handler: d}}
	var wg sync.WaitGroup
	for _, s := range servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.ActivateAndServe()
		}()
		<-started
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
		wg.Wait()
	})
	return d
}

func (d *dnsServer) add(rr string) error {
	r, err := dns.NewRR(rr)
	if err != nil || r == nil {
		return fmt.Errorf("testnet: bad DNS record %q: %v", rr, err)
	}
	name := strings.ToLower(r.Header().Name)
	d.mu.Lock()
	d.records[name] = append(d.records[name], r)
	d.mu.Unlock()
	return nil
}

func (d *dnsServer) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg).SetReply(q)
	m.Authoritative = true
	d.mu.Lock()
	d.queries++
	if len(q.Question) == 1 {
		qq := q.Question[0]
		rrs, ok := d.records[strings.ToLower(qq.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, rr := range rrs {
			if rr.Header().Rrtype == qq.Qtype {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
		}
	} else {
		m.Rcode = dns.RcodeFormatError
	}
	d.mu.Unlock()
	w.WriteMsg(m)
}

// AddRecord adds a record (zone-file syntax, e.g. "x.example. 60 IN A
// 203.0.113.10") to the test DNS server.
func (n *Net) AddRecord(rr string) error { return n.dns.add(rr) }

// DNSQueries is how many queries the test DNS server has answered.
func (n *Net) DNSQueries() int {
	n.dns.mu.Lock()
	defer n.dns.mu.Unlock()
	return n.dns.queries
}
