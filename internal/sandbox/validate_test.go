package sandbox

import (
	"errors"
	"strings"
	"testing"

	"isopod/internal/admission"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/workspace"
)

func TestNormalize(t *testing.T) {
	host := admission.Host{CPUs: 8, MemTotalMiB: 16384}
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
		{"cwd with NUL", ok(Request{Cwd: "/a\x00b"}), "NUL"},
		{"cwd over PATH_MAX", ok(Request{Cwd: "/" + strings.Repeat("d", agentproto.MaxPath)}), "--cwd"},
		{"copy-out guest with NUL", ok(Request{CopyOut: []CopyOut{{Guest: "/a\x00b", Host: "/tmp/x"}}}), "--copy-out"},
		{"workspace guest over PATH_MAX", ok(Request{Workspace: &workspace.Request{Host: "/", Guest: "/" + strings.Repeat("w", agentproto.MaxPath)}}), "--workspace"},
		{"no-network with allow", ok(Request{NoNetwork: true, AllowHosts: []string{"a.b"}}), "--no-network"},
		{"deny with allow", ok(Request{DenyEgress: true, AllowCIDRs: []string{"10.0.0.0/8"}}), "--deny-egress"},
		{"bad cidr", ok(Request{AllowCIDRs: []string{"10.0.0.0/99"}}), "--allow-cidr"},
		{"bad host", ok(Request{AllowHosts: []string{"*.*.example.com"}}), "--allow-host"},
		{"label base", ok(Request{CommitAs: "base"}), "reserved"},
		{"label dash", ok(Request{CommitAs: "-x"}), "'-'"},
		{"label space", ok(Request{CommitAs: "a b"}), "contains a space"},
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
	_, err := normalize(Request{Argv: []string{"true"}, AllowHosts: []string{"*.org"}}, admission.Host{CPUs: 2, MemTotalMiB: 4096})
	if err == nil || !strings.Contains(err.Error(), "--allow-host") {
		t.Errorf("got %v; want a refusal naming --allow-host", err)
	}
}

// TestNormalizeDefaultsAndLimits pins the documented defaults and limits
// (README's flag table) to literal values.
func TestNormalizeDefaultsAndLimits(t *testing.T) {
	big := admission.Host{CPUs: 64, MemTotalMiB: 64 << 10}
	got, err := normalize(Request{Argv: []string{"true"}}, big)
	if err != nil {
		t.Fatal(err)
	}
	if got.VCPUs != 1 || got.MemMiB != 512 || got.ScratchMiB != 0 || got.TimeoutS != 120 || got.Stage != "base" || got.Base != "" {
		t.Errorf("defaults %+v; want 1 vCPU, 512 MiB, scratch unset (1024), 120 s, stage base, base unset (base-min)", got)
	}
	if DefaultScratchMiB != 1024 || DefaultBase != "base-min" {
		t.Errorf("default scratch %d MiB, base %q; want 1024 and base-min", DefaultScratchMiB, DefaultBase)
	}
	small := admission.Host{CPUs: 4, MemTotalMiB: 2048}
	for _, tt := range []struct {
		name string
		host admission.Host
		req  Request
		ok   bool
	}{
		{"32 vCPUs on a big host", big, Request{VCPUs: 32}, true},
		{"34 vCPUs on a big host", big, Request{VCPUs: 34}, false},
		{"4 vCPUs on 4 CPUs", small, Request{VCPUs: 4}, true},
		{"6 vCPUs on 4 CPUs", small, Request{VCPUs: 6}, false},
		{"4096 MiB on a big host", big, Request{MemMiB: 4096}, true},
		{"4098 MiB on a big host", big, Request{MemMiB: 4098}, false},
		{"MemTotal-512 on a small host", small, Request{MemMiB: 1536}, true},
		{"above MemTotal-512", small, Request{MemMiB: 1537}, false},
		{"128 MiB", small, Request{MemMiB: 128}, true},
		{"scratch 128", big, Request{ScratchMiB: 128}, true},
		{"scratch 65536", big, Request{ScratchMiB: 65536}, true},
		{"scratch 65537", big, Request{ScratchMiB: 65537}, false},
		{"timeout 1", big, Request{TimeoutS: 1}, true},
		{"timeout 3600", big, Request{TimeoutS: 3600}, true},
	} {
		tt.req.Argv = []string{"true"}
		_, err := normalize(tt.req, tt.host)
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v; want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// TestArgErrorsNameTheField: a refused field carries its neutral name, the
// value and a reason free of CLI flags, so that the MCP server can say it
// in its own words; Error() is the CLI's wording.
func TestArgErrorsNameTheField(t *testing.T) {
	host := admission.Host{CPUs: 2, MemTotalMiB: 4096}
	for _, tt := range []struct {
		req          Request
		field, value string
		cli          string
	}{
		{Request{VCPUs: 3}, "vcpus", "3", "--vcpus 3: must be 1 or an even number, at most 2"},
		{Request{MemMiB: 4000}, "mem_mib", "4000", "--mem-mib 4000: must be between 128 and 3584"},
		{Request{ScratchMiB: 1}, "scratch_mib", "1", "--scratch-mib 1: must be between 128 and 65536"},
		{Request{TimeoutS: -1}, "timeout_s", "-1", "--timeout-s -1: must be between 1 and 3600 seconds"},
		{Request{Cwd: "tmp"}, "cwd", `"tmp"`, `--cwd "tmp": must be an absolute guest path`},
		{Request{CommitAs: "st-x"}, "commit_as", `"st-x"`, `--commit-as "st-x": starts with st- and would shadow stage ids`},
		{Request{Env: []string{"=x"}}, "env", "", "--env: "},
	} {
		tt.req.Argv = []string{"true"}
		_, err := normalize(tt.req, host)
		var ae *errdefs.ArgError
		if !errors.As(err, &ae) {
			t.Errorf("%+v: %v; want an *errdefs.ArgError", tt.req, err)
			continue
		}
		if ae.Field != tt.field || ae.Value != tt.value || strings.Contains(ae.Reason, "--") {
			t.Errorf("%+v: field %q value %q reason %q; want field %q value %q and no flag in the reason",
				tt.req, ae.Field, ae.Value, ae.Reason, tt.field, tt.value)
		}
		if !strings.HasPrefix(err.Error(), tt.cli) {
			t.Errorf("CLI wording %q; want it to start with %q", err, tt.cli)
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v is not ErrInvalidArgument", err)
		}
	}
}

// TestCheckSizeRefusesZero: an explicit zero is out of range and the
// refusal names the limits.
func TestCheckSizeRefusesZero(t *testing.T) {
	for field, want := range map[string]string{
		"timeout_s":   "--timeout-s 0: must be between 1 and 3600 seconds",
		"vcpus":       "--vcpus 0: must be 1 or an even number, at most",
		"mem_mib":     "--mem-mib 0: must be between 128 and",
		"scratch_mib": "--scratch-mib 0: must be between 128 and 65536",
	} {
		err := CheckSize(field, 0)
		if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckSize(%s, 0) = %v; want an invalid argument starting %q", field, err, want)
		}
	}
	if err := CheckSize("timeout_s", 1); err != nil {
		t.Errorf("CheckSize(timeout_s, 1) = %v", err)
	}
	if err := CheckSize("nonsense", 1); err == nil {
		t.Error("CheckSize accepted an unknown field")
	}
}

// TestNormalizeEgress: a list given at all, even empty, makes the run
// filtered; with no rule in either list it denies everything.
func TestNormalizeEgress(t *testing.T) {
	host := admission.Host{CPUs: 2, MemTotalMiB: 4096}
	for _, tt := range []struct {
		name    string
		req     Request
		mode    string
		denyAll bool
		refused string
	}{
		{"nothing", Request{}, NetworkNAT, false, ""},
		{"lan egress", Request{AllowLANEgress: true}, NetworkNAT, false, ""},
		{"no network", Request{NoNetwork: true}, NetworkNone, false, ""},
		{"deny egress", Request{DenyEgress: true}, NetworkFiltered, true, ""},
		{"empty hosts", Request{AllowHosts: []string{}}, NetworkFiltered, true, ""},
		{"empty cidrs", Request{AllowCIDRs: []string{}}, NetworkFiltered, true, ""},
		{"both empty", Request{AllowHosts: []string{}, AllowCIDRs: []string{}}, NetworkFiltered, true, ""},
		{"empty hosts, a cidr", Request{AllowHosts: []string{}, AllowCIDRs: []string{"192.0.2.0/24"}}, NetworkFiltered, false, ""},
		{"a host, empty cidrs", Request{AllowHosts: []string{"pypi.org"}, AllowCIDRs: []string{}}, NetworkFiltered, false, ""},
		{"deny egress, empty cidrs", Request{DenyEgress: true, AllowCIDRs: []string{}}, NetworkFiltered, true, ""},
		{"no network, empty cidrs", Request{NoNetwork: true, AllowCIDRs: []string{}}, "", false, "--no-network cannot be combined"},
		{"no network, empty hosts", Request{NoNetwork: true, AllowHosts: []string{}}, "", false, "--no-network cannot be combined"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Argv = []string{"true"}
			got, err := normalize(tt.req, host)
			if tt.refused != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.refused) {
					t.Errorf("got %v; want invalid_argument mentioning %q", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.NetworkMode() != tt.mode || got.DenyEgress != tt.denyAll {
				t.Errorf("mode %s deny-all %v; want %s %v", got.NetworkMode(), got.DenyEgress, tt.mode, tt.denyAll)
			}
			if m := got.rules.Mode(); string(m) != tt.mode || got.rules.DenyAll() != tt.denyAll {
				t.Errorf("parsed rules: mode %s deny-all %v; want %s %v", m, got.rules.DenyAll(), tt.mode, tt.denyAll)
			}
		})
	}
}
