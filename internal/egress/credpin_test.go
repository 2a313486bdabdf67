package egress

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"isopod/internal/errdefs"
)

// pinnedFilter allows secret.wild.example's wildcard, a rule naming
// secret.example itself and a CIDR over its address, and pins
// secret.example (and the address it resolved to) as a credential's host.
func pinnedFilter(t *testing.T) *Filter {
	t.Helper()
	table := map[string][]string{"secret.example": {"203.0.113.50"}, "api.wild.example": {"203.0.113.51"},
		"ok.example": {"203.0.113.52"}}
	pins, err := ParsePins([]string{"Secret.Example.", "api.wild.example"}, []netip.Addr{netip.MustParseAddr("203.0.113.50")})
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFilter(FilterConfig{
		Rules: parsedRules(t, Switches{AllowHosts: []string{"secret.example", "*.wild.example", "ok.example"},
			AllowCIDRs: []string{"203.0.113.50/32"}}),
		Lookup: fixedLookup(table),
		Pinned: pins,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestPinnedCredentialDNS(t *testing.T) {
	f := pinnedFilter(t)
	for _, name := range []string{"secret.example", "SECRET.example.", "api.wild.example"} {
		if v, a := ask(f, name, "A"); v.Allow || v.Reason != ReasonPinnedCredential || a != nil {
			t.Errorf("DNS %s: %+v %+v; want refused %s", name, v, a, ReasonPinnedCredential)
		}
		if _, err := f.ResolveDNS(context.Background(), name, "A"); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("ResolveDNS %s: %v; want ErrNotAllowed", name, err)
		}
	}
	if v, a := ask(f, "ok.example", "A"); !v.Allow || a == nil || a.rcode != "NOERROR" {
		t.Errorf("an allowed name beside the pinned ones: %+v %+v", v, a)
	}
}

func TestPinnedCredentialTCP(t *testing.T) {
	f := pinnedFilter(t)
	// The pinned address is refused though a CIDR allows it.
	if v := f.Decide(tcpFlow("203.0.113.50", 443)); v.Allow || v.Reason != ReasonPinnedCredential {
		t.Errorf("tcp to the pinned address: %+v", v)
	}
	// An address handed out for a pinned name (never by the filter; a
	// defence in depth) is refused too.
	f.Pin("api.wild.example", []netip.Addr{netip.MustParseAddr("203.0.113.51")})
	if v := f.Decide(tcpFlow("203.0.113.51", 8443)); v.Allow || v.Reason != ReasonPinnedCredential || v.Host != "api.wild.example" {
		t.Errorf("tcp to an address pinned to a credential host: %+v", v)
	}
	// A connection to an allowed name's address that names the pinned host.
	ask(f, "ok.example", "A")
	for _, from := range []string{HostFromSNI, HostFromHTTP} {
		fl := tcpFlow("203.0.113.52", 443)
		fl.Host, fl.HostFrom = "secret.example", from
		if v := f.Sniff(fl); v.Allow || v.Reason != ReasonPinnedCredential {
			t.Errorf("sniffed %s naming the pinned host: %+v", from, v)
		}
	}
	if v := f.Decide(tcpFlow("203.0.113.52", 443)); !v.Allow {
		t.Errorf("tcp to an allowed name's address: %+v", v)
	}
}

func TestPinnedCredentialJudge(t *testing.T) {
	f := pinnedFilter(t)
	for _, host := range []string{"secret.example", "Secret.Example.", "api.wild.example", "203.0.113.50", "[::ffff:203.0.113.50]"} {
		tg, v, err := f.Judge(context.Background(), host, 443)
		if err != nil || v.Allow || v.Reason != ReasonPinnedCredential || tg.Dial.IsValid() {
			t.Errorf("proxy request for %s: %+v %+v %v; want refused %s", host, tg, v, err, ReasonPinnedCredential)
		}
	}
	if _, v, err := f.Judge(context.Background(), "ok.example", 443); err != nil || !v.Allow {
		t.Errorf("proxy request for an allowed name: %+v %v", v, err)
	}
}

func TestPinnedCredentialConfig(t *testing.T) {
	if _, err := ParsePins([]string{"bad host"}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a pinned host that is no name: %v; want invalid argument", err)
	}
}

// TestPinnedCredentialIDN checks that an internationalised credential host
// stays pinned however the guest spells it: Unicode in any case, its
// punycode form in any case, a trailing dot, even under a wildcard rule.
func TestPinnedCredentialIDN(t *testing.T) {
	pins, err := ParsePins([]string{"Bücher.shop.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFilter(FilterConfig{Rules: parsedRules(t, Switches{AllowHosts: []string{"*.shop.example"}}),
		Lookup: fixedLookup(map[string][]string{"xn--bcher-kva.shop.example": {"203.0.113.60"}}), Pinned: pins})
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"bücher.shop.example", "BÜCHER.SHOP.EXAMPLE.", "xn--bcher-kva.shop.example", "XN--BCHER-KVA.Shop.example."} {
		if _, v, err := f.Judge(context.Background(), host, 443); err != nil || v.Allow || v.Reason != ReasonPinnedCredential {
			t.Errorf("proxy request for %s: %+v %v; want refused %s", host, v, err, ReasonPinnedCredential)
		}
		if v, _ := ask(f, host, "A"); v.Allow || v.Reason != ReasonPinnedCredential {
			t.Errorf("DNS %s: %+v; want refused %s", host, v, ReasonPinnedCredential)
		}
	}
}
