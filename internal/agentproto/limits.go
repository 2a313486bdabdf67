package agentproto

import "encoding/json"

// What one request can carry. A request is one frame whose JSON header is
// at most MaxHeader bytes; the caller's strings in it (an exec's argv, env
// and cwd, a copy-out's path) share that header with the rest of the
// message. The host refuses a request over these limits before it starts
// a VM, so that the guest never sees it.

// HeaderRoom is what a request's header needs besides the caller's
// strings: its id, kind, field names, numbers and punctuation.
const HeaderRoom = 1 << 10

// MaxRequestStrings is how many bytes the caller's strings of one request
// may take together in its header, as EncodedLen counts them.
const MaxRequestStrings = MaxHeader - HeaderRoom

// MaxPath is the size of the longest path the guest accepts, its
// terminating NUL included: the guest kernel's PATH_MAX. A path is at most
// MaxPath-1 bytes.
const MaxPath = 4096

// EncodedLen is how many bytes s takes in a header: its JSON encoding
// (quotes and escapes included; a byte that is not UTF-8 becomes a
// six-byte escape) and the comma after it.
func EncodedLen(s string) int {
	b, _ := json.Marshal(s)
	return len(b) + 1
}

// EncodedLens is the sum of EncodedLen over ss.
func EncodedLens(ss []string) int {
	n := 0
	for _, s := range ss {
		n += EncodedLen(s)
	}
	return n
}
