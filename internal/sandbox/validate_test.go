package sandbox

import (
	"errors"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

func TestNormalize(t *testing.T) {
	host := hostLimits{CPUs: 8, MemTotalMiB: 16384}
	ok := func(r Request) Request { r.Argv = []string{"true"}; return r }
	tests := []struct {
		name string
		req  Request
		want string // "" = valid; else a substring of the error
	}{
		{"defaults", ok(Request{}), ""},
		{"no argv", Request{}, "no command"},
		{"vcpus odd", ok(Request{VCPUs: 3}), "--vcpus 3"},
		{"vcpus even", ok(Request{VCPUs: 4}), ""},
		{"vcpus over host", ok(Request{VCPUs: 10}), "at most 8"},
		{"mem low", ok(Request{MemMiB: 64}), "--mem-mib 64"},
		{"mem high", ok(Request{MemMiB: 8192}), "4096"},
		{"scratch low", ok(Request{ScratchMiB: 100}), "--scratch-mib"},
		{"timeout high", ok(Request{TimeoutS: 3601}), "3600"},
		{"env bad", ok(Request{Env: []string{"=x"}}), "--env"},
		{"cwd relative", ok(Request{Cwd: "tmp"}), "--cwd"},
		{"copy-out relative guest", ok(Request{CopyOut: []CopyOut{{Guest: "x", Host: "/tmp/x"}}}), "absolute"},
		{"no-network with allow", ok(Request{NoNetwork: true, AllowHosts: []string{"a.b"}}), "--no-network"},
		{"deny with allow", ok(Request{DenyEgress: true, AllowCIDRs: []string{"10.0.0.0/8"}}), "--deny-egress"},
		{"bad cidr", ok(Request{AllowCIDRs: []string{"10.0.0.0/99"}}), "--allow-cidr"},
		{"bad host", ok(Request{AllowHosts: []string{"*.*.example.com"}}), "--allow-host"},
		{"label base", ok(Request{CommitAs: "base"}), "reserved"},
		{"label dash", ok(Request{CommitAs: "-x"}), "'-'"},
		{"label space", ok(Request{CommitAs: "a b"}), "printable"},
		{"label ok", ok(Request{CommitAs: "proj/deps"}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := normalize(tt.req, host)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v; want valid", err)
				}
				if got.VCPUs == 0 || got.MemMiB == 0 || got.TimeoutS == 0 || got.Stage == "" {
					t.Errorf("defaults not filled: %+v", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error mentioning %q", err, tt.want)
			}
			if n := strings.Count(err.Error(), tt.want); strings.HasPrefix(tt.want, "--") && n > 1 {
				t.Errorf("%q appears %d times in %q: a context wrapped twice", tt.want, n, err)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error is not ErrInvalidArgument: %v", err)
			}
		})
	}
}

func TestNormalizeRefusesBroadWildcard(t *testing.T) {
	_, err := normalize(Request{Argv: []string{"true"}, AllowHosts: []string{"*.org"}}, hostLimits{CPUs: 2, MemTotalMiB: 4096})
	if err == nil || !strings.Contains(err.Error(), "--allow-host") {
		t.Errorf("got %v; want a refusal naming --allow-host", err)
	}
}
