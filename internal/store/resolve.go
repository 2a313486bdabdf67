package store

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"isopod/internal/errdefs"
)

// IDPrefix starts every stage id.
const IDPrefix = "st-"

// IDPattern matches a whole stage id: IDPrefix and 16 lowercase hex
// digits, the start of the layer's content digest. It is the one
// definition of the form; everything that checks a stage id uses it.
var IDPattern = regexp.MustCompile(`^st-[0-9a-f]{16}$`)

// MinIDPrefix is the fewest hex digits of a stage id that Resolve takes
// for a prefix of one, given with or without IDPrefix.
const MinIDPrefix = 4

// maxCandidates is how many stages an ambiguous reference's error lists.
const maxCandidates = 5

// Resolve finds the stage ref names. It tries, in order: an exact stage id,
// an exact vanity name, an exact label; then the stages ref is a prefix
// of: of a label, or, when ref is at least MinIDPrefix hex digits (with or
// without IDPrefix), of a stage id. One such stage is the answer; more are
// an ambiguous reference (errdefs.ErrInvalidArgument listing them); none
// is errdefs.ErrNotFound. "base" resolves to the empty stage: a zero Meta
// whose IsBase reports true (no layers).
func (s *Store) Resolve(ref string) (Meta, error) {
	if ref == "" || ref == BaseRef {
		return Match(ref, nil)
	}
	if IDPattern.MatchString(ref) {
		m, err := s.readMeta(ref)
		if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
			return m, err
		}
	}
	all, err := s.List()
	if err != nil {
		return Meta{}, err
	}
	return Match(ref, all)
}

// Match is Resolve over the stages all: it finds the one ref names, by
// exact id, vanity name or label, then by a prefix of a label or an id.
func Match(ref string, all []Meta) (Meta, error) {
	switch ref {
	case "":
		return Meta{}, fmt.Errorf("empty stage reference: give an id, name or label (see `isopod stage list`), or %q: %w",
			BaseRef, errdefs.ErrInvalidArgument)
	case BaseRef:
		return Meta{}, nil
	}
	for _, m := range all {
		if m.ID == ref || m.Name == ref {
			return m, nil
		}
	}
	for _, m := range all {
		if m.Label == ref {
			return m, nil
		}
	}
	return pickPrefix(ref, all)
}

// pickPrefix is Resolve's last step: the one stage whose label or id ref
// is a prefix of.
func pickPrefix(ref string, all []Meta) (Meta, error) {
	hexDigits, isID := idPrefix(ref)
	var cands []Meta
	for _, m := range all {
		if strings.HasPrefix(m.Label, ref) || (isID && strings.HasPrefix(m.ID, IDPrefix+hexDigits)) {
			cands = append(cands, m)
		}
	}
	switch len(cands) {
	case 1:
		return cands[0], nil
	case 0:
		if short, ok := strings.CutPrefix(ref, IDPrefix); ok && !isID && isHex(short) {
			return Meta{}, fmt.Errorf("stage id prefix %q is too short: give at least %d hex digits after %s (see `isopod stage list`): %w",
				ref, MinIDPrefix, IDPrefix, errdefs.ErrInvalidArgument)
		}
		return Meta{}, fmt.Errorf("no stage matches %q (see `isopod stage list`): %w", ref, errdefs.ErrNotFound)
	}
	names := make([]string, 0, maxCandidates+1)
	for i, m := range cands {
		if i == maxCandidates {
			names = append(names, fmt.Sprintf("and %d more", len(cands)-maxCandidates))
			break
		}
		names = append(names, fmt.Sprintf("%s (%s)", m.Label, m.ID))
	}
	return Meta{}, fmt.Errorf("stage reference %q is ambiguous: it starts %s; give more of it, or the whole id: %w",
		ref, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
}

// idPrefix returns the hex digits of ref, given with or without IDPrefix,
// when ref is long enough to be taken for a prefix of a stage id.
func idPrefix(ref string) (string, bool) {
	h := strings.ToLower(strings.TrimPrefix(ref, IDPrefix))
	if len(h) < MinIDPrefix || len(h) > len("0123456789abcdef") || !isHex(h) {
		return "", false
	}
	return h, true
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}
