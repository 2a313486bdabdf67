package egress

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

func TestParseRulesAccepts(t *testing.T) {
	for _, tt := range []struct {
		name     string
		sw       Switches
		mode     Mode
		denyAll  bool
		allowLAN bool
		rules    []string
	}{
		{"nothing", Switches{}, ModeNAT, false, false, []string{}},
		{"lan", Switches{AllowLAN: true}, ModeNAT, false, true, []string{}},
		{"no network", Switches{NoNetwork: true}, ModeOff, false, false, []string{}},
		{"deny egress", Switches{DenyAll: true}, ModeFiltered, true, false, []string{}},
		{"deny egress, empty lists", Switches{DenyAll: true, AllowHosts: []string{}, AllowCIDRs: []string{}}, ModeFiltered, true, false, []string{}},
		{"empty hosts", Switches{AllowHosts: []string{}}, ModeFiltered, true, false, []string{}},
		{"empty cidrs", Switches{AllowCIDRs: []string{}}, ModeFiltered, true, false, []string{}},
		{"exact host", Switches{AllowHosts: []string{"pypi.org"}}, ModeFiltered, false, false, []string{"host:pypi.org"}},
		{"host normalised", Switches{AllowHosts: []string{"PyPI.org."}}, ModeFiltered, false, false, []string{"host:pypi.org"}},
		{"wildcard", Switches{AllowHosts: []string{"*.pythonhosted.org"}}, ModeFiltered, false, false, []string{"host:*.pythonhosted.org"}},
		{"duplicates collapse", Switches{AllowHosts: []string{"a.example", "A.example", "a.example."}}, ModeFiltered, false, false, []string{"host:a.example"}},
		{"cidr", Switches{AllowCIDRs: []string{"203.0.113.0/24"}}, ModeFiltered, false, false, []string{"cidr:203.0.113.0/24"}},
		{"cidr masked", Switches{AllowCIDRs: []string{"203.0.113.7/24"}}, ModeFiltered, false, false, []string{"cidr:203.0.113.0/24"}},
		{"one address", Switches{AllowCIDRs: []string{"203.0.113.7"}}, ModeFiltered, false, false, []string{"cidr:203.0.113.7/32"}},
		{"mapped address", Switches{AllowCIDRs: []string{"::ffff:203.0.113.0/120"}}, ModeFiltered, false, false, []string{"cidr:203.0.113.0/24"}},
		{"ipv6 range", Switches{AllowCIDRs: []string{"2001:db8::/32"}}, ModeFiltered, false, false, []string{"cidr:2001:db8::/32"}},
		{"cidr duplicates", Switches{AllowCIDRs: []string{"10.0.0.0/8", "10.1.2.3/8"}}, ModeFiltered, false, false, []string{"cidr:10.0.0.0/8"}},
		{"hosts and cidrs, lan", Switches{AllowHosts: []string{"db.example"}, AllowCIDRs: []string{"192.168.1.0/24"}, AllowLAN: true},
			ModeFiltered, false, true, []string{"host:db.example", "cidr:192.168.1.0/24"}},
		{"empty hosts, a cidr", Switches{AllowHosts: []string{}, AllowCIDRs: []string{"192.0.2.0/24"}}, ModeFiltered, false, false, []string{"cidr:192.0.2.0/24"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRules(tt.sw)
			if err != nil {
				t.Fatal(err)
			}
			if r.Mode() != tt.mode || tt.sw.Mode() != tt.mode || r.DenyAll() != tt.denyAll || r.AllowLAN() != tt.allowLAN || !slices.Equal(r.Strings(), tt.rules) {
				t.Errorf("mode %s (switches %s) deny-all %v lan %v rules %q; want %s %v %v %q",
					r.Mode(), tt.sw.Mode(), r.DenyAll(), r.AllowLAN(), r.Strings(), tt.mode, tt.denyAll, tt.allowLAN, tt.rules)
			}
		})
	}
}

func TestParseRulesRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		sw   Switches
		// rule and fix are what the error must say: the switch at fault
		// (and its value) and what to do instead.
		rule, fix string
	}{
		{"no network with a host", Switches{NoNetwork: true, AllowHosts: []string{"a.example"}}, "--no-network", "pick one"},
		{"no network with empty hosts", Switches{NoNetwork: true, AllowHosts: []string{}}, "--no-network", "pick one"},
		{"no network with empty cidrs", Switches{NoNetwork: true, AllowCIDRs: []string{}}, "--no-network", "pick one"},
		{"no network with deny", Switches{NoNetwork: true, DenyAll: true}, "--no-network", "pick one"},
		{"no network with lan", Switches{NoNetwork: true, AllowLAN: true}, "--no-network", "pick one"},
		{"deny with a host", Switches{DenyAll: true, AllowHosts: []string{"a.example"}}, "--deny-egress", "drop one"},
		{"deny with a cidr", Switches{DenyAll: true, AllowCIDRs: []string{"10.0.0.0/8"}}, "--deny-egress", "drop one"},
		{"empty host", Switches{AllowHosts: []string{""}}, `--allow-host ""`, "spaces"},
		{"padded host", Switches{AllowHosts: []string{" a.example"}}, `--allow-host " a.example"`, "spaces"},
		{"inner wildcard", Switches{AllowHosts: []string{"a.*.example"}}, `--allow-host "a.*.example"`, "as in *.example.org"},
		{"double wildcard", Switches{AllowHosts: []string{"*.*.example.com"}}, `--allow-host "*.*.example.com"`, "as in *.example.org"},
		{"wildcard over a tld", Switches{AllowHosts: []string{"*.org"}}, `--allow-host "*.org"`, "name the domain"},
		{"address as host", Switches{AllowHosts: []string{"203.0.113.7"}}, `--allow-host "203.0.113.7"`, "use --allow-cidr"},
		{"ipv6 as host", Switches{AllowHosts: []string{"2001:db8::1"}}, `--allow-host "2001:db8::1"`, "use --allow-cidr"},
		{"url as host", Switches{AllowHosts: []string{"https://a.example/x"}}, `--allow-host "https://a.example/x"`, "without scheme, port or path"},
		{"host with port", Switches{AllowHosts: []string{"a.example:443"}}, `--allow-host "a.example:443"`, "without scheme, port or path"},
		{"bad label", Switches{AllowHosts: []string{"a_b..example"}}, `--allow-host "a_b..example"`, "--allow-host"},
		{"prefix too long", Switches{AllowCIDRs: []string{"10.0.0.0/33"}}, `--allow-cidr "10.0.0.0/33"`, "want ADDR/BITS"},
		{"not an address", Switches{AllowCIDRs: []string{"nope"}}, `--allow-cidr "nope"`, "want ADDR/BITS"},
		{"two slashes", Switches{AllowCIDRs: []string{"10.0.0.1/8/2"}}, `--allow-cidr "10.0.0.1/8/2"`, "want ADDR/BITS"},
		{"host name as cidr", Switches{AllowCIDRs: []string{"a.example"}}, `--allow-cidr "a.example"`, "want ADDR/BITS"},
		{"one bad among good", Switches{AllowCIDRs: []string{"10.0.0.0/8", "10.0.0.0/99"}}, `--allow-cidr "10.0.0.0/99"`, "want ADDR/BITS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules(tt.sw)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("got %v; want invalid_argument", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.rule) || !strings.Contains(msg, tt.fix) {
				t.Errorf("error %q; want it to name %q and say %q", msg, tt.rule, tt.fix)
			}
		})
	}
}

// TestFilterTakesParsedRules: the Filter is built from [Rules] alone, whose
// fields only ParseRules fills. A FilterConfig field that carried rules as
// text would let a caller skip the parse; none may.
func TestFilterTakesParsedRules(t *testing.T) {
	var _ Rules = FilterConfig{}.Rules // compile-time: the rules are the parsed type
	ft := reflect.TypeFor[FilterConfig]()
	for i := range ft.NumField() {
		if f := ft.Field(i); isText(f.Type) {
			t.Errorf("FilterConfig.%s is %s: a filter takes parsed rules, not text", f.Name, f.Type)
		}
	}
	rt := reflect.TypeFor[Rules]()
	for i := range rt.NumField() {
		if f := rt.Field(i); f.IsExported() {
			t.Errorf("Rules.%s is exported: only ParseRules may fill a Rules", f.Name)
		}
	}
	// The zero Rules is NAT, so a filter cannot be had without a parse.
	if _, err := NewFilter(FilterConfig{Lookup: fixedLookup(nil)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a filter over unparsed (zero) rules: %v; want invalid_argument", err)
	}
	f := newTestFilter(t, Switches{AllowCIDRs: []string{"198.51.100.7/24"}})
	if got := f.Rules().CIDRs(); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}) {
		t.Errorf("filter's ranges %v", got)
	}
}

// isText reports whether t is a string or a list of strings.
func isText(t reflect.Type) bool {
	return t.Kind() == reflect.String || (t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String)
}
