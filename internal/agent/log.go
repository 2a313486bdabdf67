package agent

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
)

// LogPrefix starts every line the agent writes to the console.
const LogPrefix = "isopod-agent: "

// NewConsoleLogger returns a logger that writes one plain line per record to
// w: "isopod-agent: message key=value ...". Debug records are written only
// when debug is set. Lines are short and unadorned because they end up on a
// serial console that the host copies into its logs.
func NewConsoleLogger(w io.Writer, debug bool) *slog.Logger {
	lvl := slog.LevelInfo
	if debug {
		lvl = slog.LevelDebug
	}
	return slog.New(&lineHandler{mu: new(sync.Mutex), w: w, level: lvl})
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

type lineHandler struct {
	mu     *sync.Mutex
	w      io.Writer
	level  slog.Level
	prefix string // accumulated "key=value " text from WithAttrs
	group  string
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(LogPrefix)
	if r.Level != slog.LevelInfo {
		b.WriteString(r.Level.String())
		b.WriteByte(' ')
	}
	b.WriteString(r.Message)
	if h.prefix != "" {
		b.WriteByte(' ')
		b.WriteString(strings.TrimSuffix(h.prefix, " "))
	}
	r.Attrs(func(a slog.Attr) bool {
		appendAttr(&b, h.group, a)
		return true
	})
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	for _, a := range as {
		appendAttr(&b, h.group, a)
	}
	n := *h
	n.prefix += strings.TrimPrefix(b.String(), " ") + " "
	return &n
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.group = h.group + name + "."
	return &n
}

func appendAttr(b *strings.Builder, group string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		g := group
		if a.Key != "" {
			g += a.Key + "."
		}
		for _, sub := range a.Value.Group() {
			appendAttr(b, g, sub)
		}
		return
	}
	b.WriteByte(' ')
	b.WriteString(group)
	b.WriteString(a.Key)
	b.WriteByte('=')
	v := a.Value.String()
	if v == "" || strings.ContainsAny(v, " =\"\t\n") {
		v = strconv.Quote(v)
	}
	b.WriteString(v)
}
