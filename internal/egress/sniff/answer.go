package sniff

import (
	"io"
	"strings"
)

// Downstream wraps the server's side of the connection, so that the Guard
// sees the server's answer to a request that asks to switch protocols: the
// client's later bytes are HTTP again unless that answer is 101, and HTTP/2
// if the switch was to h2c. Its Read also tells the Guard when the server
// is gone.
func (g *Guard) Downstream(r io.Reader) io.Reader { return &downstream{g: g, r: r} }

type downstream struct {
	g *Guard
	r io.Reader
}

var _ io.Reader = (*downstream)(nil)

func (d *downstream) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if n > 0 && d.g.watching.Load() {
		d.g.observe(p[:n])
	}
	if err != nil {
		d.g.mu.Lock()
		d.g.downDone = true
		d.g.cond.Broadcast()
		d.g.mu.Unlock()
	}
	return n, err
}

// observe reads the server's first response heads until a final one (or
// 101) says what the client's next bytes are.
func (g *Guard) observe(p []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.answered {
		return
	}
	g.answer = append(g.answer, p...)
	for {
		n, err := headEnd(g.answer)
		if err != nil || (n == 0 && len(g.answer) > maxHead) {
			g.decide(stRequest)
			return
		}
		if n == 0 {
			return
		}
		code, upgrade := statusOf(g.answer[:n])
		switch {
		case code == 101 && (upgrade == "h2c" || (upgrade == "" && !onlyOthers(g.upgrades))):
			g.decide(stPreface)
		case code == 101:
			g.decide(stOpaque)
		case code >= 100 && code < 200:
			g.answer = g.answer[n:]
			continue
		default:
			g.decide(stRequest)
		}
		return
	}
}

// onlyOthers reports whether protos lacks h2c.
func onlyOthers(protos []string) bool {
	for _, p := range protos {
		if p == "h2c" {
			return false
		}
	}
	return true
}

// decide ends the watch.
//
// Preconditions: g.mu is held.
func (g *Guard) decide(next state) {
	g.answered, g.next, g.answer = true, next, nil
	g.watching.Store(false)
	g.cond.Broadcast()
}

// statusOf reads a response head's status code and Upgrade protocol (lower
// case, "" when none); code 0 when it is not a response.
func statusOf(head []byte) (code int, upgrade string) {
	lines := strings.Split(strings.TrimLeft(string(head), "\r\n"), "\r\n")
	f := strings.SplitN(lines[0], " ", 3)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/1.") || len(f[1]) != 3 || strings.Trim(f[1], "0123456789") != "" {
		return 0, ""
	}
	code = int(f[1][0]-'0')*100 + int(f[1][1]-'0')*10 + int(f[1][2]-'0')
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(name, "upgrade") {
			proto, _, _ := strings.Cut(strings.TrimSpace(value), "/")
			upgrade = strings.ToLower(proto)
		}
	}
	return code, upgrade
}

// await holds the client's bytes until the server has answered the
// Upgrade request.
func (g *Guard) await() error {
	g.mu.Lock()
	for !g.answered && !g.downDone {
		g.cond.Wait()
	}
	answered, next := g.answered, g.next
	g.mu.Unlock()
	if !answered {
		return io.EOF
	}
	g.upgrades = nil
	g.state = next
	return nil
}
