package agentclient

import (
	"strings"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// What the guest protocol can carry, checked before any VM starts: a
// request over it would boot a VM only to fail when it is sent. The limits
// are agentproto's (one request is one frame). The errors are
// errdefs.ArgErrors naming the caller's field.

// CheckExec refuses a command the guest protocol cannot carry: its argv
// (the request field argvField: argv, or cmd for a shell command line),
// env and cwd travel in one exec request with the base image's env
// (baseEnv).
func CheckExec(argvField string, argv, env []string, cwd string, baseEnv []string) error {
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.Arg(argvField, nil, "contains a NUL byte, which no program can receive")
		}
	}
	sizes := map[string]int{
		argvField: agentproto.EncodedLens(argv),
		"env":     agentproto.EncodedLens(env),
		"cwd":     agentproto.EncodedLen(cwd),
	}
	base := agentproto.EncodedLens(baseEnv)
	total := sizes[argvField] + sizes["env"] + sizes["cwd"] + base
	if total <= agentproto.MaxRequestStrings {
		return nil
	}
	// The caller's field that takes the most is the one to shorten.
	field := argvField
	if sizes["env"] > sizes[field] {
		field = "env"
	}
	value := ""
	if field == "env" {
		value = largestEnv(env)
	}
	return errdefs.Arg(field, value, "the command, its env and cwd travel to the guest in one request, which carries at most %d bytes of them as the guest protocol encodes them (JSON, escapes included); they take %d: the command %d, env %d, cwd %d and the base image's env %d. Pass large data on stdin or in a file instead",
		agentproto.MaxRequestStrings, total, sizes[argvField], sizes["env"], sizes["cwd"], base)
}

// largestEnv names the largest of env's entries by its key.
func largestEnv(env []string) string {
	var best string
	for _, kv := range env {
		if len(kv) > len(best) {
			best = kv
		}
	}
	k, _, _ := strings.Cut(best, "=")
	return k
}

// CheckGuestPath refuses a guest path, of the request field field, that
// the guest cannot take: one longer than its PATH_MAX or holding a NUL
// byte. The front ends check their own path arguments with it.
func CheckGuestPath(field, p string) error {
	if strings.IndexByte(p, 0) >= 0 {
		return errdefs.Arg(field, nil, "the guest path contains a NUL byte")
	}
	if len(p) >= agentproto.MaxPath {
		return errdefs.Arg(field, nil, "the guest path is %d bytes; the guest takes paths of at most %d bytes", len(p), agentproto.MaxPath-1)
	}
	return nil
}
