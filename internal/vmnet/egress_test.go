package vmnet

import (
	"slices"
	"testing"
)

func TestProxyEnv(t *testing.T) {
	env := ProxyEnv("10.0.2.1")
	for _, want := range []string{
		"HTTP_PROXY=http://10.0.2.1:3128", "http_proxy=http://10.0.2.1:3128",
		"HTTPS_PROXY=http://10.0.2.1:3128", "https_proxy=http://10.0.2.1:3128",
		"ALL_PROXY=socks5h://10.0.2.1:1080", "all_proxy=socks5h://10.0.2.1:1080",
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	} {
		if !slices.Contains(env, want) {
			t.Errorf("proxy env %v lacks %s", env, want)
		}
	}
}

// TestProxyEnvDirect: hosts reached directly (the credential endpoint's
// gateway) join NO_PROXY in both cases.
func TestProxyEnvDirect(t *testing.T) {
	env := ProxyEnv("10.0.2.1", "10.0.2.1")
	for _, want := range []string{"NO_PROXY=localhost,127.0.0.1,::1,10.0.2.1", "no_proxy=localhost,127.0.0.1,::1,10.0.2.1"} {
		if !slices.Contains(env, want) {
			t.Errorf("proxy env %v lacks %s", env, want)
		}
	}
}
