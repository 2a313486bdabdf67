package mcpserver

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
)

// Bearer tokens of a network listener. The token file holds one token a
// line, "ROLE TOKEN": ROLE is run (sandbox_run, the read-only tools:
// stage_list, stage_info, vm_list, image_list, and the session tools on
// its own sessions) or admin (also stage_rm and vm_gc, and every
// session); TOKEN is at least 16 characters without white space. Blank
// lines and lines starting with # are ignored. A presented token is
// compared with every line in constant time, as SHA-256 sums, so neither
// the time nor the order of the lines says how much of a token was right.

// Roles a token may have.
const (
	RoleRun   = "run"
	RoleAdmin = "admin"
)

// minTokenLen is the shortest token a file may hold.
const minTokenLen = 16

// toolRoles is the role each tool needs; a tool not named needs admin.
var toolRoles = map[string]string{
	ToolSandboxRun: RoleRun, ToolStageList: RoleRun, ToolStageInfo: RoleRun,
	ToolVMList: RoleRun, ToolImageList: RoleRun,
	// A run token sees and acts on its own sessions only; an admin token
	// on every one (sessions.go).
	ToolSessionStart: RoleRun, ToolSessionExec: RoleRun, ToolSessionJob: RoleRun, ToolSessionExpose: RoleRun,
	ToolSessionPause: RoleRun, ToolSessionResume: RoleRun, ToolSessionFork: RoleRun, ToolSessionCommit: RoleRun,
	ToolSessionStop: RoleRun, ToolSessionList: RoleRun,
	ToolStageRm: RoleAdmin, ToolVMGC: RoleAdmin,
}

// Tokens is a loaded token file.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	role string
	sum  [sha256.Size]byte
	line int
}

// LoadTokens reads a token file. The warnings are for the start-up log (a
// file others may read).
func LoadTokens(path string) (*Tokens, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--token-file: %w", err)
	}
	defer f.Close()
	var warns []string
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		warns = append(warns, fmt.Sprintf("--token-file %s is readable by others (mode %v); make it 0600", path, fi.Mode().Perm()))
	}
	t, err := ParseTokens(f)
	if err != nil {
		return nil, nil, fmt.Errorf("--token-file %s: %w", path, err)
	}
	return t, warns, nil
}

// ParseTokens reads the lines of a token file. Errors name the line, never
// a token.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	sc := bufio.NewScanner(r)
	seen := map[[sha256.Size]byte]int{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"ROLE TOKEN\" (ROLE run or admin): %w", n, errdefs.ErrInvalidArgument)
		}
		if f[0] != RoleRun && f[0] != RoleAdmin {
			return nil, fmt.Errorf("line %d: role %q: use run or admin: %w", n, f[0], errdefs.ErrInvalidArgument)
		}
		if len(f[1]) < minTokenLen {
			return nil, fmt.Errorf("line %d: the token is %d characters; use at least %d (e.g. openssl rand -hex 32): %w",
				n, len(f[1]), minTokenLen, errdefs.ErrInvalidArgument)
		}
		sum := sha256.Sum256([]byte(f[1]))
		if prev, ok := seen[sum]; ok {
			return nil, fmt.Errorf("line %d: the same token as line %d: %w", n, prev, errdefs.ErrInvalidArgument)
		}
		seen[sum] = n
		t.entries = append(t.entries, tokenEntry{role: f[0], sum: sum, line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.entries) == 0 {
		return nil, fmt.Errorf("no tokens: add a line \"run TOKEN\" or \"admin TOKEN\": %w", errdefs.ErrInvalidArgument)
	}
	return t, nil
}

// Verify is an auth.TokenVerifier: it finds token among the file's in
// constant time and names its roles (admin includes run) and its line
// (the principal logs and cancellation use).
func (t *Tokens) Verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	match := -1
	for i, e := range t.entries {
		eq := subtle.ConstantTimeCompare(sum[:], e.sum[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return nil, fmt.Errorf("%w: the bearer token is not one this server accepts", auth.ErrInvalidToken)
	}
	e := t.entries[match]
	scopes := []string{RoleRun}
	if e.role == RoleAdmin {
		scopes = []string{RoleAdmin, RoleRun}
	}
	return &auth.TokenInfo{Scopes: scopes, UserID: fmt.Sprintf("%s-token-line-%d", e.role, e.line),
		Extra: map[string]any{ownerKey: ownerOf(token)}}, nil
}

// ownerKey holds, in a verified token's TokenInfo.Extra, the owner id of
// the sessions it starts.
const ownerKey = "isopod_session_owner"

// ownerOf is the owner id a token's sessions are recorded with: a hash
// of the token under a purpose of its own, never the token, and the same
// across restarts and edits of the token file.
func ownerOf(token string) string {
	sum := sha256.Sum256([]byte("isopod session owner\x00" + token))
	return hex.EncodeToString(sum[:16])
}

// authorize refuses a call whose token lacks the tool's role. Calls on
// stdio carry no token: the local user who started the server may call
// every tool.
func (s *Server) authorize(tool string, req *mcp.CallToolRequest) error {
	if !s.cfg.Remote {
		return nil
	}
	need := toolRoles[tool]
	if need == "" {
		need = RoleAdmin
	}
	var ti *auth.TokenInfo
	if req != nil && req.Extra != nil {
		ti = req.Extra.TokenInfo
	}
	if ti == nil {
		return errors.New(tool + " refused: the call carries no bearer token")
	}
	if !slices.Contains(ti.Scopes, need) {
		return fmt.Errorf("%s refused: it needs a token with the %s role; this call's token (%s) has only %s",
			tool, need, ti.UserID, strings.Join(ti.Scopes, ", "))
	}
	return nil
}

// challenged puts protected (the SDK's bearer-token check) in front of
// next, and gives its 401s the WWW-Authenticate header RFC 6750 asks for:
// Bearer realm="isopod", with error="invalid_token" when a token was
// presented but is not one this server accepts.
func challenged(protected func(http.Handler) http.Handler, next http.Handler) http.Handler {
	inner := protected(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := w.(*challengeWriter); ok {
			w = c.ResponseWriter
		}
		next.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := strings.Fields(r.Header.Get("Authorization"))
		presented := len(f) == 2 && strings.EqualFold(f[0], "bearer")
		inner.ServeHTTP(&challengeWriter{ResponseWriter: w, presented: presented}, r)
	})
}

// challengeWriter adds WWW-Authenticate to a 401.
type challengeWriter struct {
	http.ResponseWriter
	presented bool
}

func (c *challengeWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		v := `Bearer realm="isopod"`
		if c.presented {
			v += `, error="invalid_token"`
		}
		c.Header().Set("WWW-Authenticate", v)
	}
	c.ResponseWriter.WriteHeader(code)
}
