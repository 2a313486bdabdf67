package oci

import (
	"io"
	"net/http"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// watchTransport is the HTTP transport under every registry call (the
// credential exchange included): each request is watched for stalls,
// and a manifest's or index's body is capped at MaxManifestBytes and,
// when it was asked for by digest, checked against that digest as it is
// read.
type watchTransport struct {
	next  http.RoundTripper
	stall Stall
}

func (t *watchTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r, w := watchRequest(req, t.stall)
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		w.stop()
		if serr := w.err(true); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	w.add(headerBytes(resp))
	resp.Body = &watchedBody{rc: resp.Body, w: w, response: true}
	ref, ok := manifestRef(req)
	if !ok || req.Method != http.MethodGet {
		return resp, nil
	}
	what := "manifest " + ref
	if resp.ContentLength > MaxManifestBytes {
		resp.Body.Close()
		return nil, &TooLargeError{What: what, Size: resp.ContentLength}
	}
	body := CapReader(resp.Body, what)
	if h, err := v1.NewHash(ref); err == nil && resp.StatusCode == http.StatusOK {
		if v, err := NewVerifier(body, h, -1, what); err == nil {
			body = v
		}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{body, resp.Body}
	return resp, nil
}

// manifestRef is the reference of a request for /v2/NAME/manifests/REF.
func manifestRef(r *http.Request) (string, bool) {
	p := r.URL.Path
	i := strings.LastIndex(p, "/manifests/")
	if !strings.HasPrefix(p, "/v2/") || i < 0 {
		return "", false
	}
	ref := p[i+len("/manifests/"):]
	return ref, ref != "" && !strings.Contains(ref, "/")
}

// headerBytes is about what a response's status line and headers took.
func headerBytes(resp *http.Response) int {
	n := len(resp.Status) + 12
	for k, vs := range resp.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
