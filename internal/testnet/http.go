package testnet

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Paths served by [Handler].
const (
	// HelloPath answers HelloBody.
	HelloPath = "/hello"
	HelloBody = "hello from the isopod test network\n"
	// HostPath echoes the request's Host header.
	HostPath = "/host"
	// BigPath serves BigSize deterministic bytes (see BigBody); ?size=N
	// serves the first N instead.
	BigPath = "/big"
	BigSize = 100 << 20
)

// Handler serves the test network's fixed content.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(HelloPath, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, HelloBody)
	})
	mux.HandleFunc(HostPath, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Host)
	})
	mux.HandleFunc(BigPath, func(w http.ResponseWriter, r *http.Request) {
		size := int64(BigSize)
		if s := r.URL.Query().Get("size"); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 || n > 1<<32 {
				http.Error(w, "size must be 0..4GiB", http.StatusBadRequest)
				return
			}
			size = n
		}
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		io.Copy(w, BigBody(size))
	})
	return mux
}

// ServeHTTP serves h (Handler() when nil) on addr inside namespace ns until
// t ends, and returns the listening address. It speaks HTTP/1 and HTTP/2
// cleartext.
func (n *Net) ServeHTTP(t testing.TB, ns, addr string, h http.Handler) string {
	t.Helper()
	if h == nil {
		h = Handler()
	}
	l, err := n.Listen(ns, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // HTTP/2 with prior knowledge, as curl --http2-prior-knowledge
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: &protos}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("testnet HTTP server on %s: %v", addr, err)
		}
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return l.Addr().String()
}

// BigBody returns size deterministic, incompressible-looking bytes: the same
// for every call and process.
func BigBody(size int64) io.Reader {
	return io.LimitReader(&prng{r: rand.New(rand.NewPCG(0x150b0d, 0x7e57))}, size)
}

type prng struct {
	r   *rand.Rand
	buf [8]byte
	n   int
}

func (p *prng) Read(b []byte) (int, error) {
	for i := 0; i < len(b); i++ {
		if p.n == 0 && len(b)-i >= 8 {
			binary.LittleEndian.PutUint64(b[i:], p.r.Uint64())
			i += 7
			continue
		}
		if p.n == 0 {
			v := p.r.Uint64()
			for j := range 8 {
				p.buf[j] = byte(v >> (8 * j))
			}
			p.n = 8
		}
		b[i] = p.buf[8-p.n]
		p.n--
	}
	return len(b), nil
}

var (
	bigSumOnce sync.Once
	bigSum     string
)

// BigSHA256 is the hex SHA-256 of BigBody(BigSize).
func BigSHA256() string {
	bigSumOnce.Do(func() {
		h := sha256.New()
		io.Copy(h, BigBody(BigSize))
		bigSum = hex.EncodeToString(h.Sum(nil))
	})
	return bigSum
}

// ServeBanner answers every connection on l with banner and closes it,
// until t ends.
func ServeBanner(t testing.TB, l net.Listener, banner string) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, banner)
			c.Close()
		}
	}()
}
