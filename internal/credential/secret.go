package credential

import (
	"fmt"
	"log/slog"
)

// Secret holds a secret value. Every way Go prints or encodes a value
// shows only [Redacted]; the bytes are reachable inside this package alone.
type Secret struct {
	b []byte
}

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
