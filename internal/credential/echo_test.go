package credential

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

// TestGatewayDropsEchoedSecret checks that a host that echoes the
// request's credential in a response header (a redirect's Location, a
// debug header, a cookie) does not hand the secret, raw or as the scheme
// signed it, to the guest: such headers are dropped.
func TestGatewayDropsEchoedSecret(t *testing.T) {
	ca := newTestCA(t)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		_, tok, _ := strings.Cut(v, " ")
		w.Header().Set("Location", "https://u:"+tok+"@elsewhere.example/")
		w.Header().Set("X-Echo", v)
		w.Header().Add("Set-Cookie", "t="+tok)
		w.Header().Set("X-Kept", "ok")
		w.WriteHeader(http.StatusFound)
	})
	gw := newTestGateway(t, upstreamTLS(t, ca, echo), ca, decls, nil)
	basic := base64.StdEncoding.EncodeToString([]byte("bot:" + testSecret))
	for _, alias := range []string{"bear", "bas", "hdr"} {
		path := "/x/y"
		resp, body := gw.raw(t, "GET", "/"+alias+path, "")
		var head strings.Builder
		resp.Header.Write(&head)
		for _, s := range []string{testSecret, basic} {
			if strings.Contains(head.String(), s) || strings.Contains(body, s) {
				t.Errorf("%s: the response holds the secret: %d %q", alias, resp.StatusCode, head.String())
			}
		}
		if resp.StatusCode != http.StatusFound || resp.Header.Get("X-Kept") != "ok" {
			t.Errorf("%s: %d %q; want 302 with X-Kept", alias, resp.StatusCode, head.String())
		}
		gw.nextEvent(t)
	}
}
