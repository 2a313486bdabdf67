package credential

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
)

// Secret holds a secret value. Every way Go prints or encodes a value
// shows only [Redacted]; the bytes are reachable inside this package alone.
// They sit behind a pointer, so that a Secret in an unexported field,
// which fmt prints by reflection without calling its methods, shows as an
// address.
type Secret struct {
	v *secretValue
}

// secretValue is a Secret's bytes.
type secretValue struct{ b []byte }

// Redacted is what a Secret prints as.
const Redacted = "[redacted]"

func (s Secret) String() string             { return Redacted }
func (s Secret) GoString() string           { return Redacted }
func (s Secret) Format(f fmt.State, _ rune) { f.Write([]byte(Redacted)) }
func (s Secret) LogValue() slog.Value       { return slog.StringValue(Redacted) }

// MarshalJSON refuses: a secret is never serialised.
func (s Secret) MarshalJSON() ([]byte, error) { return nil, errSerialise }

// MarshalText refuses: a secret is never serialised.
func (s Secret) MarshalText() ([]byte, error) { return nil, errSerialise }

var errSerialise = fmt.Errorf("credential: a secret cannot be serialised")

// newSecret checks v as a header value: not empty, visible ASCII, space
// and tab only. The error never holds v.
func newSecret(v []byte) (Secret, error) {
	if len(v) == 0 {
		return Secret{}, fmt.Errorf("the secret is empty")
	}
	for _, c := range v {
		if (c < 0x20 || c > 0x7e) && c != '\t' {
			return Secret{}, fmt.Errorf("the secret has a byte outside visible ASCII, space and tab")
		}
	}
	return Secret{v: &secretValue{b: append([]byte(nil), v...)}}, nil
}

// sign is the one way out of a Secret: it sets the header that presents
// it upstream as scheme says (user for basic, name for header).
func (s Secret) sign(h http.Header, scheme Scheme, user, name string) {
	switch scheme {
	case SchemeBearer:
		h["Authorization"] = []string{"Bearer " + string(s.v.b)}
	case SchemeBasic:
		h["Authorization"] = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+string(s.v.b)))}
	case SchemeHeader:
		h[name] = []string{string(s.v.b)}
	}
}

// shownIn reports whether v holds the secret, as it is or as scheme
// signs it for user (base64, padded or not).
func (s Secret) shownIn(v string, scheme Scheme, user string) bool {
	if s.empty() {
		return false
	}
	if strings.Contains(v, string(s.v.b)) {
		return true
	}
	b64 := strings.TrimRight(base64.StdEncoding.EncodeToString([]byte(user+":"+string(s.v.b))), "=")
	return scheme == SchemeBasic && strings.Contains(v, b64)
}

// empty reports whether s holds no value (a Credential not made by
// Resolve).
func (s Secret) empty() bool { return s.v == nil || len(s.v.b) == 0 }
