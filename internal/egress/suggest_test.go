package egress

import (
	"fmt"
	"slices"
	"testing"
)

func TestSuggest(t *testing.T) {
	attempts := []Attempt{
		{Proto: ProtoDNS, Host: "pypi.org", QType: "A", Reason: ReasonNotAllowed},
		{Proto: ProtoDNS, Host: "pypi.org", QType: "AAAA", Reason: ReasonNotAllowed},
		{Proto: ProtoDNS, Host: "txt.example", QType: "TXT", Reason: ReasonDNSType},
		{Proto: ProtoDNS, Host: "<invalid:12>", QType: "A", Reason: ReasonInvalidName},
		{Proto: ProtoHTTPProxy, Host: "files.pythonhosted.org", Port: 443, Reason: ReasonNotAllowed},
		{Proto: ProtoSOCKS, Host: "github.com", Port: 22, Reason: ReasonNotAllowed},
		{Proto: ProtoTCP, Host: "203.0.113.7", Port: 443, Reason: ReasonLiteral},
		{Proto: ProtoTCP, Host: "192.168.1.1", Port: 80, Reason: ReasonPrivate},
		{Proto: ProtoUDP, Host: "8.8.8.8", Port: 53, Reason: ReasonNonTCP},
		{Proto: ProtoDNS, Host: MalformedHost, Reason: ReasonMalformed},
		{Proto: ProtoCredential, Host: "api.example", Port: 443, Reason: ReasonCredentialRefused},
		{Proto: ProtoCredential, Host: "api.example", Port: 443, Allowed: true, Reason: ReasonCredentialAllowed},
		{Proto: ProtoTCP, Host: "api.example", Port: 443, Reason: ReasonPinnedCredential},
	}
	s := Suggest(attempts)
	wantHosts := []string{"files.pythonhosted.org", "github.com", "pypi.org"}
	if fmt.Sprint(s.AllowHosts) != fmt.Sprint(wantHosts) || fmt.Sprint(s.AllowCIDRs) != "[203.0.113.7/32]" {
		t.Errorf("suggestion hosts %v cidrs %v", s.AllowHosts, s.AllowCIDRs)
	}
	wantFlags := "[--allow-host files.pythonhosted.org --allow-host github.com --allow-host pypi.org --allow-cidr 203.0.113.7/32]"
	if fmt.Sprint(s.Flags) != wantFlags {
		t.Errorf("flags %v", s.Flags)
	}
	if len(s.Unallowable) != 5 || !slices.Contains(s.Unallowable, "dns <malformed> (malformed)") ||
		!slices.Contains(s.Unallowable, "tcp api.example:443 (pinned_credential_host)") || s.Events != len(attempts) {
		t.Errorf("unallowable %v events %d", s.Unallowable, s.Events)
	}
	// The suggestion, fed back, allows what was asked.
	f, err := NewFilter(FilterConfig{Rules: parsedRules(t, Switches{AllowHosts: s.AllowHosts, AllowCIDRs: s.AllowCIDRs}), Lookup: fixedLookup(nil)})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range wantHosts {
		if !f.AllowsName(h) {
			t.Errorf("suggested filter refuses %s", h)
		}
	}
	if v := f.Decide(tcpFlow("203.0.113.7", 443)); !v.Allow {
		t.Errorf("suggested filter refuses the literal: %+v", v)
	}
	if empty := Suggest(nil); empty.Flags == nil || len(empty.Flags) != 0 {
		t.Errorf("empty suggestion %+v", empty)
	}
}
