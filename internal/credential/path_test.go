package credential

import "testing"

// TestNormalPath checks the endpoint's path rule on its own, including
// what net/http already refuses before a handler runs.
func TestNormalPath(t *testing.T) {
	for in, want := range map[string]string{
		"": "/", "/": "/", "/a": "/a", "/a/b/": "/a/b/", "/a%41/b%C3%A9": "/a%41/b%C3%A9", "/a:b@c!$&'()*+,=~-._": "/a:b@c!$&'()*+,=~-._",
		"/.a/..b/a.": "/.a/..b/a.", "/%3f%23": "/%3f%23",
	} {
		if got, ok := normalPath(in); !ok || got != want {
			t.Errorf("normalPath(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"//", "/a//b", "/.", "/..", "/a/.", "/a/../b", "/%2e", "/%2E%2e", "/a%2fb", "/a%2F", "/a%5c", "/a%5C",
		"/%25", "/%252e", "/%00", "/%1f", "/%20", "/%7f", "/%3b", "/%3B", "/%zz", "/%2", "/%", "/a%g0", `/a\b`, "/a;b", "/a#b",
		"/a b", "/a\tb", "/a\x00", "/a\x7f", "/a\xc3\xa9", "/a\"b", "/a<b>", "/a{b}", "/a|b", "/a^b", "/a`b", "/a[b]", "/a?b"} {
		if got, ok := normalPath(in); ok {
			t.Errorf("normalPath(%q) = %q; want refused", in, got)
		}
	}
}

// TestSplitTarget checks the request target forms the endpoint reads.
func TestSplitTarget(t *testing.T) {
	for in, want := range map[string]target{
		"/gh":                       {alias: "gh"},
		"/gh/":                      {alias: "gh", rest: "/"},
		"/gh/a/b?x=1":               {alias: "gh", rest: "/a/b", query: "x=1", hasQ: true},
		"/gh?":                      {alias: "gh", hasQ: true},
		"http://10.0.2.1:3129/gh/a": {alias: "gh", rest: "/a"},
		"HTTP://x/gh/a?q":           {alias: "gh", rest: "/a", query: "q", hasQ: true},
	} {
		if got, ok := splitTarget(in); !ok || got != want {
			t.Errorf("splitTarget(%q) = %+v, %v; want %+v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "*", "gh/a", "https://x/gh/a", "http://x", "example.com:443"} {
		if got, ok := splitTarget(in); ok {
			t.Errorf("splitTarget(%q) = %+v; want refused", in, got)
		}
	}
}
