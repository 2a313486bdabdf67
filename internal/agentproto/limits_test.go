package agentproto

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// A request whose strings take MaxRequestStrings bytes, with every other
// field at its widest, still fits in one frame: HeaderRoom is enough.
func TestRequestStringsFitAFrame(t *testing.T) {
	// Strings that JSON escapes, as a caller may send them.
	unit := "<\x01\xff\"é"
	fill := func(n int) []string {
		var ss []string
		for n > 0 {
			s := strings.Repeat(unit, 100)
			if EncodedLen(s) > n {
				s = strings.Repeat("a", n-3)
			}
			ss = append(ss, s)
			n -= EncodedLen(s)
		}
		return ss
	}
	argv := fill(MaxRequestStrings / 2)
	env := fill(MaxRequestStrings - EncodedLens(argv) - EncodedLen("/root"))
	if got := EncodedLens(argv) + EncodedLens(env) + EncodedLen("/root"); got != MaxRequestStrings {
		t.Fatalf("the strings take %d bytes; want exactly %d", got, MaxRequestStrings)
	}
	exec := &Msg{ID: math.MaxUint64, Kind: KindExec, Exec: &Exec{Argv: argv, Env: env, Cwd: "/root", TimeoutMS: math.MaxInt64, Stdin: true}}
	if err := WriteFrame(&bytes.Buffer{}, exec, nil); err != nil {
		t.Errorf("an exec at the limit: %v", err)
	}
	maxData := int64(math.MaxInt64)
	path := "/" + strings.Repeat("\xff", MaxPath-2)
	copyOut := &Msg{ID: math.MaxUint64, Kind: KindCopyOut, Path: path, MaxBytes: math.MaxInt64, MaxData: &maxData}
	if EncodedLen(path) > MaxRequestStrings {
		t.Fatalf("a path of MaxPath-1 bytes takes %d bytes, over MaxRequestStrings", EncodedLen(path))
	}
	if err := WriteFrame(&bytes.Buffer{}, copyOut, nil); err != nil {
		t.Errorf("a copy-out of the longest path: %v", err)
	}
}
