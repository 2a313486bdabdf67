package bench

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredScript runs the guest's loop under the host's sh with a curl
// stub that logs each URL: a warm-up of each side, then n pairs in
// alternating order, the endpoint side direct and the proxy side through
// the proxy; a body of the wrong size fails the script.
func TestCredScript(t *testing.T) {
	for _, tt := range []struct {
		name string
		size string
		ok   bool
	}{
		{"whole body", "1048576", true},
		{"short body", "1000", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "log")
			stub := "#!/bin/sh\necho \"$*\" >> " + log + "\nprintf '" + tt.size + " 0.012'\n"
			if err := os.WriteFile(filepath.Join(dir, "curl"), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", credScript(3, "198.18.0.2"))
			cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "ISOPOD_CREDENTIAL_ENDPOINT=http://10.0.2.1:3129", "http_proxy=http://10.0.2.1:3128"}
			out, err := cmd.Output()
			if !tt.ok {
				if err == nil {
					t.Errorf("the script passed a short body: %s", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("script: %v\n%s", err, out)
			}
			cred, proxy, err := parseCredSamples(string(out), 3)
			if err != nil || len(cred) != 3 || len(proxy) != 3 || cred[0] != 12 || proxy[2] != 12 {
				t.Errorf("samples %v %v, %v; want 3 of 12 ms each", cred, proxy, err)
			}
			b, _ := os.ReadFile(log)
			var order []string
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				switch {
				case strings.Contains(line, "--noproxy * http://10.0.2.1:3129/bench/1mib"):
					order = append(order, "c")
				case strings.Contains(line, "-x http://10.0.2.1:3128 http://198.18.0.2/1mib"):
					order = append(order, "p")
				default:
					t.Errorf("curl %s", line)
				}
			}
			if got := strings.Join(order, ""); got != "cpcppcc"+"p" {
				t.Errorf("order %s; want a warm-up of each, then pairs alternating (cpcppccp)", got)
			}
		})
	}
}

// TestParseCredSamples: lines other than samples are ignored; a sample
// that is not a number, or too few samples, is an error.
func TestParseCredSamples(t *testing.T) {
	for _, tt := range []struct {
		name, out string
		ok        bool
	}{
		{"two", "noise\nsample 0.5 0.25\nsample 1 2\n", true},
		{"not a number", "sample x 0.25\nsample 1 2\n", false},
		{"too few", "sample 0.5 0.25\n", false},
	} {
		cred, proxy, err := parseCredSamples(tt.out, 2)
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
		if tt.ok && (cred[0] != 500 || proxy[0] != 250 || proxy[1] != 2000) {
			t.Errorf("%s: %v %v", tt.name, cred, proxy)
		}
	}
}

// TestCredentialSeriesSkipped: without a way to make a Service over its
// own store, the series measures nothing and says why.
func TestCredentialSeriesSkipped(t *testing.T) {
	b := &bench{log: slog.New(slog.DiscardHandler)}
	res := &Result{Series: map[string]Stats{}, Ratios: map[string]float64{}, Extra: map[string]any{}}
	if err := b.credentialSeries(context.Background(), 1, nil, res); err != nil {
		t.Fatal(err)
	}
	why, _ := res.Extra["credential_skipped"].(string)
	if !strings.Contains(why, "credential store") || len(res.Series) != 0 || len(res.Ratios) != 0 {
		t.Errorf("skipped %q, series %v, ratios %v", why, res.Series, res.Ratios)
	}
}
