package credential

import (
	"testing"
)

// TestGatewayMethodTricks checks that a method in lower case is not the
// rule's method, that a method-override header or a second
// Content-Length does not reach the host, that CONNECT to the endpoint
// is refused, and that a chunked body sent with a Content-Length is read
// as chunked and made anew: nothing after it reaches the host.
func TestGatewayMethodTricks(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	for _, tt := range []struct {
		method, target string
		headers        []string
		status         int
		body           string
	}{
		{"get", "/bas/x/y", nil, 403, ""},
		{"post", "/bear/upload/a", []string{"Content-Length: 0"}, 403, ""},
		{"CONNECT", "localhost:443", nil, 403, ""},
		{"CONNECT", "/bear/x", nil, 403, ""},
		{"GET", "/bear/x", []string{"X-HTTP-Method-Override: DELETE", "X-Method-Override: DELETE", "X-HTTP-Method: DELETE"}, 200, ""},
		{"POST", "/bear/upload/a", []string{"Content-Length: 2", "Content-Length: 5"}, 400, ""},
		{"POST", "/bear/upload/a", []string{"Content-Length: 99", "Transfer-Encoding: chunked"}, 200, "2\r\nab\r\n0\r\n\r\nGET /bear/smuggled HTTP/1.1\r\n\r\n"},
	} {
		if tt.body == "" {
			tt.body = "ab"
		}
		resp, body := gw.raw(t, tt.method, tt.target, tt.body, tt.headers...)
		if resp.StatusCode != tt.status {
			t.Errorf("%s %s %v: %d %q; want %d", tt.method, tt.target, tt.headers, resp.StatusCode, body, tt.status)
		}
	}
	for _, r := range up.requests() {
		for k := range r.Header {
			if k != "Authorization" && k != "User-Agent" && k != "Accept-Encoding" && k != "Content-Length" {
				t.Errorf("%s %s: the host got header %s", r.Method, r.URI, k)
			}
		}
		if r.Method+" "+r.URI != "GET /x" && (r.Method+" "+r.URI != "POST /upload/a" || r.Body != 2) {
			t.Errorf("the host got %s %s", r.Method, r.URI)
		}
	}
}
