package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/idna"

	"isopod/internal/errdefs"
)

// MaxHostLen is the longest host name (RFC 1035, without the trailing dot).
const MaxHostLen = 253

// idnaProfile converts Unicode names to their ASCII (punycode) form the way
// a resolver would look them up, and lower-cases them.
var idnaProfile = idna.New(idna.MapForLookup(), idna.Transitional(false), idna.StrictDomainName(false))

// NormalizeHost returns the canonical form of a host name: lower case, no
// trailing dot, Unicode labels in their IDNA ASCII form. It fails for
// anything that is not a well-formed DNS host name: empty labels, labels
// over 63 bytes, names over 253 bytes, characters other than letters,
// digits, '-' and '_', a label starting or ending with '-', and IP address
// literals (which are addresses, not names).
func NormalizeHost(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("empty host name")
	}
	if len(s) > 4*MaxHostLen {
		return "", fmt.Errorf("host name of %d bytes is too long", len(s))
	}
	name := strings.TrimSuffix(s, ".")
	ascii := true
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		name = strings.ToLower(name)
	} else {
		a, err := idnaProfile.ToASCII(name)
		if err != nil {
			return "", fmt.Errorf("host name is not valid IDNA: %v", err)
		}
		name = strings.ToLower(a)
	}
	if err := checkName(name); err != nil {
		return "", err
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", fmt.Errorf("%q is an IP address, not a host name", name)
	}
	return name, nil
}

// checkName validates an already lower-case ASCII name.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	if len(name) > MaxHostLen {
		return fmt.Errorf("host name of %d bytes is longer than %d", len(name), MaxHostLen)
	}
	for label := range strings.SplitSeq(name, ".") {
		switch {
		case label == "":
			return fmt.Errorf("host name %q has an empty label", name)
		case len(label) > 63:
			return fmt.Errorf("host name has a label of %d bytes (at most 63)", len(label))
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Errorf("host name %q has a label starting or ending with '-'", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return fmt.Errorf("host name has a character %q outside letters, digits, '-' and '_'", c)
			}
		}
	}
	return nil
}

// RecordHost is how a host name from the guest appears in the egress
// record: its normalised form when it is a well-formed name, the canonical
// text of an IP literal, and otherwise "<invalid:N>" with only its length
// in bytes, so that untrusted bytes (control characters, terminal escapes,
// megabytes of junk) never reach a report or a log. A placeholder is
// returned as it is, so recording twice changes nothing.
func RecordHost(s string) string {
	if s == "" || IsPlaceholder(s) {
		return s // already recorded form
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return a.Unmap().String()
	}
	if n, err := NormalizeHost(s); err == nil {
		return n
	}
	return InvalidHost(len(s))
}

// InvalidHost is the record's stand-in for a malformed name of n bytes.
func InvalidHost(n int) string { return "<invalid:" + strconv.Itoa(n) + ">" }

// MalformedHost is the record's stand-in for the name of a message whose
// name could not be read at all (a DNS message that does not parse, or
// asks several questions).
const MalformedHost = "<malformed>"

// IsPlaceholder reports whether h is a stand-in ([InvalidHost] or
// [MalformedHost]) rather than a name or an address. No rule matches one.
func IsPlaceholder(h string) bool {
	if h == MalformedHost {
		return true
	}
	n, ok := strings.CutPrefix(h, "<invalid:")
	if !ok {
		return false
	}
	n, ok = strings.CutSuffix(n, ">")
	return ok && n != "" && len(n) <= 10 && strings.Trim(n, "0123456789") == ""
}

// Pattern is one --allow-host rule: an exact name, or "*." followed by a
// name, which matches exactly one more label in front of that name.
type Pattern struct {
	name     string // normalised; without "*." for a wildcard
	wildcard bool
}

// parsePattern parses an allow-host rule. The name part is normalised like
// [NormalizeHost]. A wildcard must be the whole first label and must be
// followed by at least two labels ("*.example.org", not "*.org").
func parsePattern(s string) (Pattern, error) {
	bad := func(format string, args ...any) (Pattern, error) {
		return Pattern{}, fmt.Errorf("--allow-host %q: "+format+": %w", append([]any{s}, append(args, errdefs.ErrInvalidArgument)...)...)
	}
	raw := strings.TrimSpace(s)
	if raw != s || s == "" {
		return bad("empty or padded with spaces")
	}
	wild := strings.HasPrefix(raw, "*.")
	if wild {
		raw = raw[2:]
	}
	if strings.Contains(raw, "*") {
		return bad("a wildcard may only be the whole first label, as in *.example.org")
	}
	if strings.Contains(raw, ":") || strings.Contains(raw, "/") {
		if _, err := netip.ParseAddr(raw); err == nil {
			return bad("an address is not a host name; use --allow-cidr for addresses")
		}
		return bad("give a host name without scheme, port or path")
	}
	if _, err := netip.ParseAddr(strings.TrimSuffix(raw, ".")); err == nil {
		return bad("an address is not a host name; use --allow-cidr for addresses")
	}
	name, err := NormalizeHost(raw)
	if err != nil {
		return bad("%v", err)
	}
	if wild && !strings.Contains(name, ".") {
		return bad("a wildcard over a top-level domain is too broad; name the domain, as in *.example.org")
	}
	return Pattern{name: name, wildcard: wild}, nil
}

// Match reports whether the normalised name matches p. A wildcard matches
// exactly one label in front of its name: *.example.org matches
// a.example.org, not example.org and not a.b.example.org.
func (p Pattern) Match(name string) bool {
	if !p.wildcard {
		return name == p.name
	}
	head, ok := strings.CutSuffix(name, "."+p.name)
	return ok && head != "" && !strings.Contains(head, ".")
}

// String is the normalised rule.
func (p Pattern) String() string {
	if p.wildcard {
		return "*." + p.name
	}
	return p.name
}
