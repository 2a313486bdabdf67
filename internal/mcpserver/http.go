package mcpserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
)

// The network listener: the same tools as on stdio, over MCP streamable
// HTTP (the SDK's handler) at /mcp. The SDK runs stateless: every POST is
// a session of its own, so any host behind a load balancer can answer any
// call and no affinity is needed. Each request carries a bearer token
// (tokens.go). The gate (gate.go) runs each call on a stream of its own
// (streams.go): progress notifications and the result travel on the
// call's POST response; a call outlives a dropped connection, and the
// client may resume its stream with Last-Event-ID; a notifications/cancelled
// naming the call cancels its run, and no result is sent for it.

// MCPPath is where the listener serves MCP.
const MCPPath = "/mcp"

// Handler is the listener's HTTP handler: /mcp behind the bearer-token
// check and the gate; /healthz (the process answers) and /readyz (503
// while the admission queue is full) without a token, for load balancers.
func (s *Server) Handler(tokens *Tokens) http.Handler {
	var sdkLog *slog.Logger
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		sdkLog = s.log.With("component", "mcp-sdk")
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		PropagateRequestCancellation: true,
		Logger:                       sdkLog,
		MaxRequestBodyBytes:          maxBody,
	})
	protected := auth.RequireBearerToken(tokens.Verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	g := newGate(s, sdk)
	s.onStop(g.shutdown)
	s.mu.Lock()
	s.gates = append(s.gates, g)
	s.mu.Unlock()
	mux := http.NewServeMux()
	mux.Handle(MCPPath, challenged(protected, g))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := http.StatusOK, map[string]any{"ok": true}
		if a := s.cfg.Admission; a != nil {
			st := a.Stats()
			body["admission"] = st
			if st.Queued >= st.QueueMax && st.Running+st.OtherPlaces >= st.MaxVMs {
				code, body["ok"] = http.StatusServiceUnavailable, false
			}
		}
		writeJSON(w, code, body)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// Listen opens a --listen address: host:port, or unix:PATH (a stale
// socket there is replaced; the socket is made 0660).
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", addr, err)
		}
		return ln, nil
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		// A socket nobody answers on is left over from a server that died.
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("--listen %s: another server answers there: %w", addr, errdefs.ErrAlreadyExists)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	return ln, nil
}

// LoadTLS reads a certificate and its key for the listener.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// shutdownGrace bounds how long a stopping listener waits for the
// responses in flight to end and the calls' handlers to return, once every
// call was answered and every run cancelled.
const shutdownGrace = 5 * time.Second

// Serve answers on ln with h (TLS when tlsCfg is set) until ctx ends; then
// it answers every call in flight with a JSON-RPC error saying the server
// is stopping, cancels every run, waits (a few seconds at most) for the
// responses to end and for the VMs to be torn down, and returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener, h http.Handler, tlsCfg *tls.Config) error {
	defer s.Close()
	if !s.cfg.NoStartupGC {
		s.gcAsync("startup")
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         tlsCfg,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			errc <- hs.ServeTLS(ln, "", "")
			return
		}
		errc <- hs.Serve(ln)
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serving %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	// The calls are answered first, then the runs end, then the responses.
	s.shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = hs.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	s.mu.Lock()
	gates := s.gates
	s.mu.Unlock()
	for _, g := range gates {
		if g.wait(sctx) != nil {
			s.log.Warn("calls still running when the server stopped")
			break
		}
	}
	return err
}
