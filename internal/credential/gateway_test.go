package credential

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/errdefs"
)

// decls are the aliases most tests use: one per scheme on localhost.
var decls = map[string]string{
	"bear": `{"host": "localhost", "scheme": "bearer", "source": "env:TOK", "ca_file": "%CA%", "allow": ["readonly", "POST /upload/**"]}`,
	"bas":  `{"host": "localhost", "scheme": "basic", "user": "bot", "source": "env:TOK", "ca_file": "%CA%", "allow": ["GET /x/*", "POST,PUT /upload"]}`,
	"hdr":  `{"host": "localhost", "scheme": "header", "header": "X-Api-Key", "source": "env:TOK", "ca_file": "%CA%", "allow": ["GET,POST /**"]}`,
}

// TestGatewaySchemes checks GET and POST within the allow rules with each
// scheme: the host gets the secret as the scheme says, the answer and
// its headers (less hop-by-hop ones) come back, one event is recorded.
func TestGatewaySchemes(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	for _, tt := range []struct{ alias, method, path, body, kind string }{
		{"bear", "GET", "/x/y?q=1&r=%2f", "", "bearer"},
		{"bear", "POST", "/upload/a", "payload", "bearer"},
		{"bas", "GET", "/x/y", "", "basic"},
		{"bas", "PUT", "/upload", "payload", "basic"},
		{"hdr", "POST", "/", "payload", "header"},
		{"HDR", "GET", "/a/b/", "", "header"},
	} {
		req, _ := http.NewRequest(tt.method, gw.url+"/"+tt.alias+tt.path, strings.NewReader(tt.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf("%s %s body=%d", tt.method, tt.path, len(tt.body))
		if resp.StatusCode != 200 || string(b) != want || resp.Header.Get("X-Kind") != tt.kind {
			t.Errorf("%s %s/%s: %d %q kind %q; want 200 %q", tt.method, tt.alias, tt.path, resp.StatusCode, b, resp.Header.Get("X-Kind"), want)
		}
		if resp.Header.Get("X-Private") != "" || resp.Header.Get("Connection") != "" {
			t.Errorf("hop-by-hop headers relayed: %v", resp.Header)
		}
		path, _, _ := strings.Cut(tt.path, "?")
		ev := gw.nextEvent(t)
		if !ev.Allowed || ev.Alias != strings.ToLower(tt.alias) || ev.Host != "localhost" || ev.Method != tt.method ||
			ev.Path != path || ev.Status != 200 || ev.Bytes != int64(len(want)) || ev.BytesUp != int64(len(tt.body)) || ev.Note != "" {
			t.Errorf("event %+v", ev)
		}
	}
	if h := gw.Hosts(); !slices.Equal(h, []string{"localhost"}) {
		t.Errorf("hosts %q; want [localhost], once", h)
	}
	if n := len(up.requests()); n != 6 {
		t.Errorf("host got %d requests; want 6", n)
	}
	checkNoSecret(t, gw)
}

// TestGatewayRefusals checks the checks before the host is asked, in
// order: alias, path (in every encoding of a traversal), allow rules;
// each a fixed text/plain answer and one event, the host never asked.
func TestGatewayRefusals(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	for _, tt := range []struct {
		method, target string
		status         int
		note           string
	}{
		{"GET", "/nope/x", 403, NoteUnknownAlias},
		{"GET", "/", 403, NoteUnknownAlias},
		{"GET", "/%62ear/x", 403, NoteUnknownAlias},
		{"GET", "*", 403, NoteUnknownAlias},
		{"DELETE", "/bear/x", 403, NoteNotPermitted},
		{"POST", "/bear/x", 403, NoteNotPermitted},
		{"GET", "/bas/x/y/z", 403, NoteNotPermitted},
		{"GET", "/bas/y/..%2fx", 400, NoteBadPath},
		{"GET", "/bear/../etc", 400, NoteBadPath},
		{"GET", "/bear/a/./b", 400, NoteBadPath},
		{"GET", "/bear/a/..", 400, NoteBadPath},
		{"GET", "/bear/a//b", 400, NoteBadPath},
		{"GET", "//bear/a", 403, NoteUnknownAlias},
		{"GET", "/bear/%2e%2e/x", 400, NoteBadPath},
		{"GET", "/bear/%2E%2E/x", 400, NoteBadPath},
		{"GET", "/bear/.%2e/x", 400, NoteBadPath},
		{"GET", "/bear/a%2fb", 400, NoteBadPath},
		{"GET", "/bear/a%2Fb", 400, NoteBadPath},
		{"GET", "/bear/a%5cb", 400, NoteBadPath},
		{"GET", "/bear/a%5C..%5Cb", 400, NoteBadPath},
		{"GET", `/bear/a\b`, 400, NoteBadPath},
		{"GET", `/bear/..\x`, 400, NoteBadPath},
		{"GET", "/bear/a%252e", 400, NoteBadPath},
		{"GET", "/bear/a%00b", 400, NoteBadPath},
		{"GET", "/bear/a%0ab", 400, NoteBadPath},
		{"GET", "/bear/a%20b", 400, NoteBadPath},
		{"GET", "/bear/a%7fb", 400, NoteBadPath},
		{"GET", "/bear/a%3bb", 400, NoteBadPath},
		{"GET", "/bear/a%zzb", 400, NoteBadPath},
		{"GET", "/bear/a%2", 400, NoteBadPath},
		{"GET", "/bear/a;b", 400, NoteBadPath},
		{"GET", "/bear/a#frag", 400, NoteBadPath},
		{"GET", "/bear/a?q#frag", 400, NoteBadPath},
		{"GET", "/bear/a\"b", 400, NoteBadPath},
		{"GET", "/bear/a\x7fb", 400, NoteBadPath},
		{"GET", "/bear/a\xc3\xa9", 400, NoteBadPath},
		{"GET", "http://gw:3129/bear/%2e%2e/x", 400, NoteBadPath},
	} {
		resp, body := gw.raw(t, tt.method, tt.target, "")
		if resp.StatusCode == 400 && tt.status == 400 && body == "400 Bad Request" {
			continue // net/http refuses it before the endpoint sees it (TestNormalPath checks the endpoint's own rule)
		}
		if resp.StatusCode != tt.status || !strings.HasPrefix(body, refusalPrefix) || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("%s %q: %d %q (%s); want %d and the endpoint's refusal", tt.method, tt.target, resp.StatusCode, body,
				resp.Header.Get("Content-Type"), tt.status)
			continue
		}
		if ev := gw.nextEvent(t); ev.Allowed || ev.Note != tt.note || ev.Status != tt.status {
			t.Errorf("%s %q: event %+v; want refused, note %s", tt.method, tt.target, ev, tt.note)
		}
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("the host got %d requests; want none", n)
	}
	if got := (Event{Host: "h", Note: NoteBadPath}).Flight(); got.Reason != egress.ReasonCredentialRefused || got.Proto != egress.ProtoCredential {
		t.Errorf("refusal as a flight record: %+v", got)
	}
	checkNoSecret(t, gw)
}

// TestGatewayAbsoluteForm checks a request in absolute form, as the
// HTTP proxy hands it over, whatever its authority; and that the query
// is passed on as sent and ignored by the rules.
func TestGatewayAbsoluteForm(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	for _, target := range []string{"http://10.0.2.1:3129/bas/x/y?a=%2f..&b", "HTTP://anything/bas/x/y?a=%2f..&b"} {
		resp, body := gw.raw(t, "GET", target, "")
		if resp.StatusCode != 200 || body != "GET /x/y?a=%2f..&b body=0" {
			t.Errorf("GET %s: %d %q", target, resp.StatusCode, body)
		}
	}
	if ev := gw.nextEvent(t); ev.Path != "/x/y" {
		t.Errorf("event path %q; want /x/y without the query", ev.Path)
	}
}

// TestGatewayHeaders checks that only the listed request headers reach
// the host: the guest's Authorization, Cookie, Host and others are dropped.
func TestGatewayHeaders(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	resp, body := gw.raw(t, "POST", "/hdr/h", "abc", "Authorization: Bearer guest-token", "Cookie: c=1", "X-Forwarded-For: 1.2.3.4",
		"Proxy-Authorization: Basic eA==", "Accept: application/json", "Accept-Encoding: gzip", "Content-Type: text/plain",
		"Content-Encoding: identity", "Git-Protocol: version=2", "User-Agent: git/2", "X-Api-Key: guest-key",
		"Content-Length: 3", "Forwarded: for=x")
	_ = body
	reqs := up.requests()
	if resp.StatusCode != 200 || len(reqs) != 1 {
		t.Fatalf("%d, %d requests", resp.StatusCode, len(reqs))
	}
	got := reqs[0].Header
	for k := range got {
		switch k {
		case "Accept", "Accept-Encoding", "Content-Type", "Content-Encoding", "Git-Protocol", "User-Agent", "X-Api-Key", "Content-Length":
		default:
			t.Errorf("header %s: %q reached the host", k, got[k])
		}
	}
	if got.Get("X-Api-Key") != testSecret || len(got.Values("X-Api-Key")) != 1 || got.Get("Git-Protocol") != "version=2" ||
		got.Get("User-Agent") != "git/2" {
		t.Errorf("host saw %v", got)
	}
}

// TestGatewayRedirect checks that a redirect is relayed as is, not
// followed.
func TestGatewayRedirect(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	resp, err := client.Get(gw.url + "/bear/redirect")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://elsewhere.example/next" || len(up.requests()) != 1 {
		t.Errorf("%d Location %q after %d requests; want 302 relayed after one", resp.StatusCode, resp.Header.Get("Location"), len(up.requests()))
	}
}

// TestGatewayStreams checks that a response's body reaches the guest as
// the host sends it: the host sends its second part only once the guest
// has read the first.
func TestGatewayStreams(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{release: make(chan struct{})}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, nil)
	resp, err := client.Get(gw.url + "/bear/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("first;"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first;" {
		t.Fatalf("first part %q, %v", first, err)
	}
	close(up.release)
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "second" {
		t.Errorf("second part %q, %v", rest, err)
	}
	if ev := gw.nextEvent(t); ev.Bytes != int64(len("first;second")) || !ev.Allowed {
		t.Errorf("event %+v", ev)
	}
	// A body the host cuts is cut for the guest too, never ended as if
	// whole.
	resp, err = client.Get(gw.url + "/bear/cut")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Errorf("a cut body read whole: %q", b)
	}
	if ev := gw.nextEvent(t); ev.Note != NoteUpstreamFailed || ev.Bytes != int64(len("part")) {
		t.Errorf("event %+v", ev)
	}
}

// TestGatewayBodies checks request bodies: chunked ones pass; one over
// MaxBody is refused with 413, chunked or not, and never reaches the
// host whole.
func TestGatewayBodies(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls, func(c *GatewayConfig) { c.MaxBody = 1000 })
	post := func(n int, chunked bool) (*http.Response, string) {
		var body io.Reader = strings.NewReader(strings.Repeat("a", n))
		if chunked {
			body = io.MultiReader(body) // no length known: sent chunked
		}
		req, _ := http.NewRequest("POST", gw.url+"/hdr/up", body)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, body := post(1000, true); resp.StatusCode != 200 || body != "POST /up body=1000" || !up.requests()[0].Chunked {
		t.Errorf("chunked body at the limit: %d %q", resp.StatusCode, body)
	}
	gw.nextEvent(t)
	for _, chunked := range []bool{false, true} {
		resp, body := post(5000, chunked)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.HasPrefix(body, refusalPrefix) {
			t.Errorf("body over the limit (chunked %v): %d %q", chunked, resp.StatusCode, body)
		}
		if ev := gw.nextEvent(t); ev.Allowed || ev.Note != NoteBodyTooLarge || ev.Status != 413 {
			t.Errorf("event %+v", ev)
		}
	}
	for _, r := range up.requests() {
		if r.Body > 1000 {
			t.Errorf("the host got a body of %d bytes", r.Body)
		}
	}
}

// TestGatewayUpstreamFailures checks 502 for a host that cannot be
// reached or whose certificate does not verify, 504 for one that does
// not answer in time.
func TestGatewayUpstreamFailures(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{}
	srv := upstreamTLS(t, ca, up)
	noCA := map[string]string{"bear": `{"host": "localhost", "scheme": "bearer", "source": "env:TOK", "allow": ["readonly"]}`}
	for _, tt := range []struct {
		name   string
		gw     *testGateway
		path   string
		status int
		note   string
	}{
		{"unreachable", newTestGateway(t, nil, ca, decls, nil), "/bear/x", 502, NoteUpstreamFailed},
		{"untrusted certificate", newTestGateway(t, srv, nil, noCA, nil), "/bear/x", 502, NoteUpstreamFailed},
		{"slow", newTestGateway(t, srv, ca, decls, func(c *GatewayConfig) { c.HeadTimeout = 200 * time.Millisecond }), "/bear/slow", 504, NoteUpstreamTimeout},
	} {
		resp, body := tt.gw.raw(t, "GET", tt.path, "")
		if resp.StatusCode != tt.status || !strings.HasPrefix(body, refusalPrefix) {
			t.Errorf("%s: %d %q; want %d", tt.name, resp.StatusCode, body, tt.status)
		}
		if ev := tt.gw.nextEvent(t); ev.Note != tt.note || ev.Status != tt.status || !ev.Allowed {
			t.Errorf("%s: event %+v", tt.name, ev)
		}
	}
}

// TestNewGatewayRefusals checks credentials the gateway will not serve.
func TestNewGatewayRefusals(t *testing.T) {
	s, _ := newSecret([]byte(testSecret))
	good := Alias{Name: "gh", Host: "api.example", Scheme: SchemeBearer, Allow: []Rule{{Methods: []string{"GET"}, Pattern: "/**"}}}
	for name, creds := range map[string][]Credential{
		"no secret":  {{Alias: good}},
		"twice":      {{Alias: good, secret: s}, {Alias: good, secret: s}},
		"upper name": {{Alias: Alias{Name: "GH", Host: good.Host, Scheme: SchemeBearer, Allow: good.Allow}, secret: s}},
		"bad host":   {{Alias: Alias{Name: "gh", Host: "127.1", Scheme: SchemeBearer, Allow: good.Allow}, secret: s}},
		"no allow":   {{Alias: Alias{Name: "gh", Host: good.Host, Scheme: SchemeBearer}, secret: s}},
	} {
		if _, err := NewGateway(GatewayConfig{Credentials: creds}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v; want invalid_argument", name, err)
		}
	}
}

// checkNoSecret checks that no event and no log line holds the secret.
func checkNoSecret(t *testing.T, gw *testGateway) {
	t.Helper()
	gw.mu.Lock()
	all := fmt.Sprintf("%+v %#v", gw.events, gw.events)
	for _, e := range gw.events {
		all += fmt.Sprintf("%+v", e.Flight())
	}
	gw.mu.Unlock()
	all += gw.logs.String()
	if strings.Contains(all, testSecret) {
		t.Errorf("the secret shows in an event or a log line")
	}
	if !strings.Contains(gw.logs.String(), "level=") {
		t.Errorf("nothing logged; the check reads nothing")
	}
}

// TestEventFlight checks an event as the flight recorder gets it.
func TestEventFlight(t *testing.T) {
	at := time.Now()
	served := Event{Time: at, Alias: "gh", Host: "api.example", Method: "GET", Path: "/a", Status: 200, Bytes: 10, BytesUp: 2, Allowed: true}
	got := served.Flight()
	if got.Proto != egress.ProtoCredential || got.Host != "api.example" || got.Port != 443 || !got.Allowed ||
		got.Reason != egress.ReasonCredentialAllowed || got.BytesDown != 10 || got.BytesUp != 2 || got.Alias != "gh" ||
		got.Method != "GET" || got.Path != "/a" || got.Status != 200 || got.Note != "" || !got.Time.Equal(at) {
		t.Errorf("served: %+v", got)
	}
	unknown := Event{Alias: "nope", Method: "GET", Status: 403, Note: NoteUnknownAlias}
	if got := unknown.Flight(); got.Allowed || got.Reason != egress.ReasonCredentialRefused || got.Port != 0 || got.Note != NoteUnknownAlias {
		t.Errorf("refused: %+v", got)
	}
}
