package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/hostio"
	"isopod/internal/knobs"
	"isopod/internal/settings"
)

// TestHTTPTokensAndRoles: a request without a token, or with one the
// server does not accept, gets 401 with the WWW-Authenticate challenge of
// RFC 6750 (error="invalid_token" only when a token was presented); each
// role reaches its tools.
func TestHTTPTokensAndRoles(t *testing.T) {
	core := &scriptedCore{}
	h := startHTTP(t, Config{Core: core}, nil)
	for tok, challenge := range map[string]string{
		"":                       `Bearer realm="isopod"`,
		"wrong-token-0123456789": `Bearer realm="isopod", error="invalid_token"`,
	} {
		if _, err := connectHTTP(t, h.url, tok, nil); err == nil {
			t.Errorf("token %q: connected", tok)
		}
		for _, method := range []string{"POST", "GET"} {
			req, _ := http.NewRequest(method, h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := httpClient(tok, nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Values("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || len(got) != 1 || got[0] != challenge {
				t.Errorf("%s with token %q: HTTP %d, WWW-Authenticate %q; want 401 and %q", method, tok, resp.StatusCode, got, challenge)
			}
		}
	}
	// Credentials of another scheme are no bearer token.
	req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || got != `Bearer realm="isopod"` {
		t.Errorf("Basic credentials: HTTP %d, WWW-Authenticate %q", resp.StatusCode, got)
	}
	ctx := context.Background()
	run := mustConnectHTTP(t, h.url, runToken)
	if res := run.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true"}, nil); res.IsError {
		t.Errorf("sandbox_run with a run token: %s", resultText(res))
	}
	if res := run.call(t, ctx, ToolStageList, map[string]any{}, nil); res.IsError {
		t.Errorf("stage_list with a run token: %s", resultText(res))
	}
	for _, tool := range []string{ToolStageRm, ToolVMGC} {
		args := map[string]any{"reference": "x"}
		if tool == ToolVMGC {
			args = map[string]any{"keep_last": 1}
		}
		res := run.call(t, ctx, tool, args, nil)
		if !res.IsError || !strings.Contains(resultText(res), "admin role") {
			t.Errorf("%s with a run token: %s", tool, resultText(res))
		}
		admin := mustConnectHTTP(t, h.url, adminToken)
		if res := admin.call(t, ctx, tool, args, nil); res.IsError {
			t.Errorf("%s with an admin token: %s", tool, resultText(res))
		}
	}
}

func TestParseTokens(t *testing.T) {
	for _, bad := range []string{"", "# only a comment\n", "run\n", "root " + runToken + "\n", "run short\n",
		"run " + runToken + "\nadmin " + runToken + "\n", "run a b c\n"} {
		if _, err := ParseTokens(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseTokens(%q) accepted", bad)
		} else if strings.Contains(err.Error(), runToken) {
			t.Errorf("an error shows the token: %v", err)
		}
	}
	tk := testTokens(t)
	ti, err := tk.Verify(context.Background(), adminToken, nil)
	if err != nil || len(ti.Scopes) != 2 {
		t.Errorf("admin token: %+v, %v", ti, err)
	}
	if _, err := tk.Verify(context.Background(), adminToken+"x", nil); err == nil {
		t.Error("a longer token was accepted")
	}
}

func TestListenRules(t *testing.T) {
	tests := []struct {
		args []string
		want string // "" means accepted
	}{
		{[]string{"--listen", "127.0.0.1:0", "--token-file", "t"}, ""},
		{[]string{"--listen", "[::1]:0", "--token-file", "t"}, ""},
		{[]string{"--listen", "localhost:0", "--token-file", "t"}, ""},
		{[]string{"--listen", "unix:/tmp/x.sock", "--token-file", "t"}, ""},
		{[]string{"--listen", "0.0.0.0:8080", "--token-file", "t", "--tls-cert", "c", "--tls-key", "k"}, ""},
		{[]string{"--listen", "0.0.0.0:8080", "--token-file", "t"}, "--tls-cert"},
		{[]string{"--listen", ":8080", "--token-file", "t"}, "--tls-cert"},
		{[]string{"--listen", "192.0.2.7:8080", "--token-file", "t"}, "reachable beyond this machine"},
		{[]string{"--listen", "127.0.0.1:0"}, "--token-file"},
		{[]string{"--token-file", "t"}, "only with --listen"},
		{[]string{"--listen", "127.0.0.1:0", "--token-file", "t", "--tls-cert", "c"}, "go together"},
		{[]string{"--push-commits"}, "--stage-registry"},
	}
	for _, tc := range tests {
		f, err := parseFlags(tc.args)
		if err == nil {
			err = f.check()
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want a refusal naming %q", tc.args, err, tc.want)
		}
	}
	// The server refuses to start, saying why, before it listens.
	var stderr bytes.Buffer
	code := mainWith(context.Background(), []string{"--listen", "0.0.0.0:0", "--token-file", "t"},
		strings.NewReader(""), io.Discard, &stderr, func(string) (string, bool) { return "", false }, "test", nil)
	if code == 0 || !strings.Contains(stderr.String(), "plain HTTP there would expose the bearer tokens") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestHTTPWithTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, rt := testCert(t, t.TempDir())
	tlsCfg, err := LoadTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := startHTTP(t, Config{Core: &scriptedCore{}}, tlsCfg)
	if !strings.HasPrefix(h.url, "https://") {
		t.Fatal(h.url)
	}
	s, err := connectHTTP(t, h.url, runToken, rt)
	if err != nil {
		t.Fatal(err)
	}
	if res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true"}, nil); res.IsError {
		t.Fatal(resultText(res))
	}
	// A client that does not trust the certificate gets nowhere, and
	// neither does one that offers only TLS 1.1.
	if _, err := connectHTTP(t, h.url, runToken, nil); err == nil {
		t.Error("connected without trusting the certificate")
	}
	old := rt.(*http.Transport).Clone()
	old.TLSClientConfig.MaxVersion = tls.VersionTLS11
	if _, err := connectHTTP(t, h.url, runToken, old); err == nil {
		t.Error("connected over TLS 1.1")
	}
}

func TestHTTPRefusesHostPathsByDefault(t *testing.T) {
	tree := newHostTree(t)
	on := settings.HostIO{StdinFile: true, CopyOut: true, Workspace: true}
	hostIO, _ := hostio.Remote(on, "", tree.Home)
	core := &scriptedCore{}
	h := startHTTP(t, Config{Core: core, HostIO: hostIO}, nil)
	s := mustConnectHTTP(t, h.url, runToken)
	for _, args := range []map[string]any{
		{"cmd": "cat", "stdin_file": filepath.Join(tree.Root, "ok.txt")},
		{"cmd": "true", "copy_out": []map[string]string{{"guest": "/etc/hostname", "host": filepath.Join(tree.Root, "x")}}},
		{"cmd": "true", "workspace": tree.Root},
	} {
		res := s.call(t, context.Background(), ToolSandboxRun, args, nil)
		if !res.IsError || !strings.Contains(resultText(res), "--host-io-root") || !strings.Contains(resultText(res), "off on this network listener") {
			t.Errorf("%v: %s", args, resultText(res))
		}
	}
	if n := len(core.requests()); n != 0 {
		t.Errorf("%d refused calls reached the core", n)
	}
	hostArgs := []string{"stdin_file", "copy_out", "workspace", "workspace_all", "workspace_out"}
	if got := runProperties(t, s); slices.ContainsFunc(hostArgs, func(a string) bool { return got[a] }) {
		t.Errorf("without --host-io-root the schema offers host paths: %v", got)
	}
	// An operator's root turns them on, confined as on stdio.
	hostIO, _ = hostio.Remote(on, tree.Root, tree.Home)
	h2 := startHTTP(t, Config{Core: core, HostIO: hostIO}, nil)
	s2 := mustConnectHTTP(t, h2.url, runToken)
	if got := runProperties(t, s2); slices.ContainsFunc(hostArgs, func(a string) bool { return !got[a] }) {
		t.Errorf("with --host-io-root the schema lacks host paths: %v", got)
	}
	if res := s2.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "cat", "stdin_file": "ok.txt"}, nil); res.IsError {
		t.Errorf("stdin_file under --host-io-root: %s", resultText(res))
	}
	res := s2.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "cat", "stdin_file": tree.Secret}, nil)
	if !res.IsError || !strings.Contains(resultText(res), knobs.MCPHostIORoot) && !strings.Contains(resultText(res), "--host-io-root") {
		t.Errorf("stdin_file outside --host-io-root: %s", resultText(res))
	}
}

// runProperties lists the arguments sandbox_run's schema offers.
func runProperties(t *testing.T, s *session) map[string]bool {
	t.Helper()
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, tl := range res.Tools {
		if tl.Name == ToolSandboxRun {
			for p := range tl.InputSchema.(map[string]any)["properties"].(map[string]any) {
				got[p] = true
			}
		}
	}
	return got
}

func TestHTTPReadFilesBinary(t *testing.T) {
	core, drv := newFakeCore(t)
	h := startHTTP(t, Config{Core: core}, nil)
	s := mustConnectHTTP(t, h.url, runToken)
	dir := t.TempDir()
	bin := make([]byte, 300<<10)
	rand.Read(bin)
	bin[0] = 0 // certainly not text
	binPath, textPath := filepath.Join(dir, "out.bin"), filepath.Join(dir, "out.txt")
	if err := os.WriteFile(binPath, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(textPath, []byte("héllo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": "true", "base": "base-min", "network": false, "cwd": "/", "read_files": []string{binPath, textPath},
	}, nil)
	if res.IsError {
		t.Fatal(resultText(res))
	}
	out := reportOf(t, res)
	if len(out.Files) != 2 {
		t.Fatalf("files %+v", out.Files)
	}
	got, err := base64.StdEncoding.DecodeString(out.Files[0].Content)
	if err != nil || out.Files[0].Encoding != "base64" || !bytes.Equal(got, bin) || out.Files[0].Bytes != int64(len(bin)) || out.Files[0].Truncated {
		t.Errorf("binary file: encoding %s, %d bytes back of %d, truncated %v, err %v", out.Files[0].Encoding, len(got), len(bin), out.Files[0].Truncated, err)
	}
	if f := out.Files[1]; f.Encoding != "utf-8" || f.Content != "héllo\n" {
		t.Errorf("text file: %+v", f)
	}
	if len(out.Copied) != 0 {
		t.Errorf("read_files show in copied: %+v", out.Copied)
	}
	// A missing guest file fails the call in read_files' words, naming no
	// server path.
	res = s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": "true", "base": "base-min", "network": false, "cwd": "/", "read_files": []string{filepath.Join(dir, "nope")},
	}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, "read_files[0]") || strings.Contains(text, "isopod-mcp-read-") {
		t.Errorf("missing file: %s", text)
	}
	if n := liveMachines(drv); n != 0 {
		t.Errorf("%d machines still run", n)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

func TestListenOnAUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mcp.sock")
	ln, err := Listen("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, %v", fi.Mode(), err)
	}
	if _, err := Listen("unix:" + path); err == nil {
		t.Error("a second listener took a socket that answers")
	}
	ln.Close()
	// Closing a unix listener removes its socket; a leftover one is
	// replaced.
	l2, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l2.(*net.UnixListener).SetUnlinkOnClose(false)
	l2.Close()
	ln, err = Listen("unix:" + path)
	if err != nil {
		t.Fatalf("a dead socket was not replaced: %v", err)
	}
	ln.Close()
}

func TestRegistryTags(t *testing.T) {
	for ref, want := range map[string]string{
		"st-0123456789abcdef": "st-0123456789abcdef",
		"st-0123":             "",
	} {
		got, ok := registryTag(ref)
		if got != want || ok != (want != "") {
			t.Errorf("registryTag(%q) = %q, %v", ref, got, ok)
		}
	}
	a, b := labelTag("proj/deps"), labelTag("proj-deps")
	if a == b || !strings.HasPrefix(a, "label-proj-deps-") || len(labelTag(strings.Repeat("é", 200))) > 128 {
		t.Errorf("label tags %q %q", a, b)
	}
	if tag, ok := registryTag("proj/deps"); !ok || tag != a {
		t.Errorf("a label's tag %q", tag)
	}
}
