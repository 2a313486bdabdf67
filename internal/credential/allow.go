package credential

import (
	"fmt"
	"slices"
	"strings"
)

// ReadOnly is the allow preset of GET and HEAD on every path.
const ReadOnly = "readonly"

// Methods are the methods an allow rule may name.
var Methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

// parseAllow parses an alias's allow list: not empty; each entry
// "readonly" or "METHOD[,METHOD...] /pattern".
func parseAllow(entries []string) ([]Rule, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf(`missing or empty: list what the secret may sign, e.g. ["readonly"] or ["GET /repos/**"]`)
	}
	rules := make([]Rule, 0, len(entries))
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// ParseRule parses one allow entry: "readonly" (GET and HEAD on /**), or
// one or more methods of [Methods] joined by commas, one space, and a
// path pattern. A pattern starts with '/'; its segments are literal, or
// "*" (exactly one non-empty segment), and its last may be "**" (any
// suffix, none included). "/" alone matches the root only. No segment is
// empty, "." or "..", none holds '*' beside other characters, and none
// holds '?', '#', '%', '\' or a character outside visible ASCII.
func ParseRule(entry string) (Rule, error) {
	if entry == ReadOnly {
		return Rule{Methods: []string{"GET", "HEAD"}, Pattern: "/**"}, nil
	}
	ms, pattern, ok := strings.Cut(entry, " ")
	if !ok {
		return Rule{}, fmt.Errorf(`%q: write "readonly" or "METHOD /path/pattern", e.g. "GET /repos/**"`, entry)
	}
	var r Rule
	for m := range strings.SplitSeq(ms, ",") {
		if !slices.Contains(Methods, m) {
			return Rule{}, fmt.Errorf("%q: method %q: use one of %s (upper case, several joined by commas)", entry, m, strings.Join(Methods, " "))
		}
		if slices.Contains(r.Methods, m) {
			return Rule{}, fmt.Errorf("%q: method %s named twice: name it once", entry, m)
		}
		r.Methods = append(r.Methods, m)
	}
	if err := checkPattern(pattern); err != nil {
		return Rule{}, fmt.Errorf("%q: %v", entry, err)
	}
	r.Pattern = pattern
	return r, nil
}

// checkPattern checks a rule's path pattern.
func checkPattern(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("the pattern must start with '/'")
	}
	if p == "/" {
		return nil
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		switch {
		case s == "":
			return fmt.Errorf("the pattern has an empty segment ('//' or a trailing '/'): remove it, or end it with /**")
		case s == "." || s == "..":
			return fmt.Errorf("the pattern has a %q segment: write the path it means", s)
		case s == "**" && i != len(segs)-1:
			return fmt.Errorf("'**' may only be the last segment")
		case s != "*" && s != "**" && strings.Contains(s, "*"):
			return fmt.Errorf("segment %q: '*' stands for a whole segment, never part of one", s)
		case !visible(s) || strings.ContainsAny(s, `?#%\`):
			return fmt.Errorf("segment %q: no '?', '#', '%%', '\\' or characters outside visible ASCII", s)
		}
	}
	return nil
}

// String is the rule as an allow entry.
func (r Rule) String() string { return strings.Join(r.Methods, ",") + " " + r.Pattern }

// Permits reports whether r allows method on path, a normalised path
// (see the gateway's checks) without its query.
func (r Rule) Permits(method, path string) bool {
	if !slices.Contains(r.Methods, method) {
		return false
	}
	return matchSegments(segments(r.Pattern), segments(path))
}

// permitted reports whether any of rules allows method on path.
func permitted(rules []Rule, method, path string) bool {
	return slices.ContainsFunc(rules, func(r Rule) bool { return r.Permits(method, path) })
}

// segments splits an absolute path into its segments: "/" is one empty
// segment, a trailing '/' ends in an empty one.
func segments(p string) []string { return strings.Split(strings.TrimPrefix(p, "/"), "/") }

// matchSegments matches a path's segments against a pattern's.
func matchSegments(pat, path []string) bool {
	for i, p := range pat {
		if p == "**" {
			return true
		}
		if i >= len(path) {
			return false
		}
		if p == "*" && path[i] == "" || p != "*" && p != path[i] {
			return false
		}
	}
	return len(pat) == len(path)
}
