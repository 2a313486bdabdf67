package credential

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
)

// Gateway is a VM's credential endpoint: an http.Handler for requests to
// /<alias>/<path>, each checked against the alias's allow rules and then
// made anew to https://<host>/<path> with the secret added.
type Gateway struct {
	cfg      GatewayConfig
	log      *slog.Logger
	maxBody  int64
	bodyIdle time.Duration
	ups      map[string]*upstream // by alias name
}

// NewGateway makes the endpoint of cfg's credentials, which must come
// from Resolve: a credential without a secret, an invalid declaration or
// an alias given twice is errdefs.ErrInvalidArgument.
func NewGateway(cfg GatewayConfig) (*Gateway, error) {
	g := &Gateway{cfg: cfg, log: cfg.Logger, maxBody: cfg.MaxBody, ups: map[string]*upstream{}}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.maxBody <= 0 {
		g.maxBody = DefaultMaxBody
	}
	if g.bodyIdle = cfg.BodyIdleTimeout; g.bodyIdle <= 0 {
		g.bodyIdle = DefaultBodyIdleTimeout
	}
	for _, c := range cfg.Credentials {
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("credential gateway: alias %q: %w: %w", c.Alias.Name, err, errdefs.ErrInvalidArgument)
		}
		if g.ups[c.Alias.Name] != nil {
			return nil, fmt.Errorf("credential gateway: alias %q given twice: %w", c.Alias.Name, errdefs.ErrInvalidArgument)
		}
		up, err := newUpstream(c, cfg)
		if err != nil {
			return nil, fmt.Errorf("credential gateway: alias %q: %w", c.Alias.Name, err)
		}
		g.ups[c.Alias.Name] = up
	}
	return g, nil
}

// check checks what the gateway relies on of a credential.
func (c Credential) check() error {
	a := c.Alias
	switch {
	case c.secret.empty():
		return fmt.Errorf("no secret: resolve the alias first")
	case !aliasName.MatchString(a.Name) || strings.ToLower(a.Name) != a.Name:
		return fmt.Errorf("not a lower-case alias name")
	case len(a.Allow) == 0:
		return fmt.Errorf("no allow rule")
	}
	if h, err := checkHost(a.Host); err != nil || h != a.Host {
		return fmt.Errorf("host %q is not a normalised host name", a.Host)
	}
	return (&a).checkScheme()
}

// Refusals: the note recorded, the status and the static message sent.
const (
	NoteUnknownAlias    = "unknown_alias"
	NoteBadPath         = "bad_path"
	NoteNotPermitted    = "not_permitted"
	NoteBodyTooLarge    = "body_too_large"
	NoteBodyStalled     = "body_stalled"
	NoteUpstreamFailed  = "upstream_failed"
	NoteUpstreamTimeout = "upstream_timeout"
)

// refusals maps a note to its status and message.
var refusals = map[string]struct {
	status int
	msg    string
}{
	NoteUnknownAlias:    {http.StatusForbidden, "no credential of that alias in this run"},
	NoteBadPath:         {http.StatusBadRequest, "path refused: only plain URL paths are served (no encoded '/', '\\', '.' or control bytes, no '.', '..' or empty segments, no ';', '\\' or '#')"},
	NoteNotPermitted:    {http.StatusForbidden, "method and path not permitted by the alias's allow rules"},
	NoteBodyTooLarge:    {http.StatusRequestEntityTooLarge, "request body over the endpoint's limit"},
	NoteBodyStalled:     {http.StatusRequestTimeout, "request body stopped arriving"},
	NoteUpstreamFailed:  {http.StatusBadGateway, "the alias's host could not be reached"},
	NoteUpstreamTimeout: {http.StatusGatewayTimeout, "the alias's host did not answer in time"},
}

// ServeHTTP serves one endpoint request (origin form, or the absolute
// form the :3128 proxy hands over, whatever its authority); it reads the
// target as sent, from r.RequestURI. A response whose body the host cuts
// is cut here too: ServeHTTP then panics with http.ErrAbortHandler, as
// net/http expects of a handler that aborts a response.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ev := Event{Time: time.Now(), Method: recordable(r.Method, 16)}
	defer g.record(&ev)
	up, path, query, note := g.check(r, &ev)
	if note != "" {
		g.refuse(w, &ev, note)
		return
	}
	g.forward(w, r, up, path+query, &ev)
}

// check runs the checks before the host is asked, in order: the alias,
// the path, the allow rules. It returns the alias's upstream, the
// normalised path and the query ("" or "?..."), or the refusing note.
func (g *Gateway) check(r *http.Request, ev *Event) (up *upstream, path, query, note string) {
	raw := r.RequestURI
	if raw == "" {
		raw = r.URL.RequestURI()
	}
	t, ok := splitTarget(raw)
	if ok && aliasName.MatchString(t.alias) {
		ev.Alias = strings.ToLower(t.alias)
		up = g.ups[ev.Alias]
	} else {
		ev.Alias = recordable(t.alias, 64)
	}
	if up == nil {
		return nil, "", "", NoteUnknownAlias
	}
	ev.Host = up.cred.Alias.Host
	path, ok = normalPath(t.rest)
	if !ok || t.hasQ && !goodQuery(t.query) {
		ev.Path = recordable(t.rest, flightrec.MaxPathLen)
		return nil, "", "", NoteBadPath
	}
	ev.Path = path
	if !permitted(up.cred.Alias.Allow, r.Method, path) {
		return nil, "", "", NoteNotPermitted
	}
	if t.hasQ {
		query = "?" + t.query
	}
	return up, path, query, ""
}

// refuse answers with note's status and static message.
func (g *Gateway) refuse(w http.ResponseWriter, ev *Event, note string) {
	rf := refusals[note]
	ev.Status, ev.Note = rf.status, note
	g.log.Info("credential endpoint request refused", "alias", ev.Alias, "method", ev.Method, "path", ev.Path, "note", note)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(refusalPrefix)+len(rf.msg)+1))
	w.WriteHeader(rf.status)
	io.WriteString(w, refusalPrefix+rf.msg+"\n")
}

// refusalPrefix starts every refusal's body.
const refusalPrefix = "isopod credential endpoint: "

// record hands ev to the recorder.
func (g *Gateway) record(ev *Event) {
	ev.Allowed = ev.Note == "" || ev.Note == NoteUpstreamFailed || ev.Note == NoteUpstreamTimeout
	if g.cfg.Record != nil {
		g.cfg.Record(*ev)
	}
}

// Hosts are the credentials' hosts, sorted, each once, which the VM's
// egress pins: nothing in the guest reaches them except through the
// endpoint.
func (g *Gateway) Hosts() []string {
	var out []string
	for _, c := range g.cfg.Credentials {
		out = append(out, c.Alias.Host)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Close closes the connections to the hosts kept for reuse. Requests
// still in flight go on.
func (g *Gateway) Close() error {
	for _, up := range g.ups {
		up.rt.CloseIdleConnections()
	}
	return nil
}

// Endpoint is the endpoint's URL for a guest whose gateway is gateway.
func Endpoint(gateway string) string {
	return "http://" + net.JoinHostPort(gateway, strconv.Itoa(EndpointPort))
}
