// Package sniff checks the names a guest's connection carries before any
// of its bytes reach a server: the server_name of a TLS ClientHello, the
// target authority and Host of every HTTP/1 request, and the :authority and
// host of every HTTP/2 cleartext request. The network paths of filtered
// egress (the userspace stack's ports 80 and 443, the proxies' tunnels)
// read the client through a [Guard], which passes on only what it has
// checked, and have each name judged by the egress policy.
//
// The HTTP/1 parser is deliberately stricter than servers are: a request
// that servers could frame differently (a bare LF, a folded or
// space-padded field name, two Hosts, both Content-Length and chunked) is
// refused rather than guessed at, so that every request a server reads is
// one the Guard judged.
package sniff
