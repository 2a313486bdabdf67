//go:build linux

package workspace

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A config's own lines are not all git reads: include.path and
// includeIf.<condition>.path name other files, read in their place, and a
// credential helper's command line may name a file it keeps secrets in
// (`store --file`). The copy keeps none of that. An include naming a file
// in the repository's git directory is replaced by that file's entries
// (its own includes replaced the same way, at most maxIncludeDepth deep,
// a cycle cut), which are then cleaned like the config's; an include
// naming anything else is dropped, and no condition is evaluated: an
// includeIf's file inside the git directory is inlined as if its
// condition held. The included files, and the credential stores in the
// git directory, are left out of the copy.

const (
	// maxIncludeDepth is how deep includes nest, as git allows.
	maxIncludeDepth = 10
	// maxIncludes caps the files inlined into one config.
	maxIncludes = 100
)

// storeNames are the files git's credential store may keep in a git
// directory by a name of its own choosing (a user's --file, copied).
var storeNames = []string{"credentials", ".git-credentials"}

// expansion is the inlining of one repository config's includes.
type expansion struct {
	gitDir string // the config's git directory: includes may name files below it
	count  int    // files inlined so far
}

// isInclude reports whether e names a file to include, as git reads it or
// in a shape git does not read (include.<sub>.path, includeIf.path).
func isInclude(e configEntry) (include, gitReads bool) {
	if e.name != "path" || (e.section != "include" && e.section != "includeif") {
		return false, false
	}
	return true, (e.section == "include") != e.hasSub
}

// expand replaces the include entries among entries, read from the file
// from, with the entries of the files they name, inside the git directory,
// and drops the others. It reports whether it changed anything.
func (s *scrub) expand(x *expansion, from string, entries []configEntry, depth int, chain []string) ([]configEntry, bool, error) {
	var out []configEntry
	changed := false
	for _, e := range entries {
		inc, reads := isInclude(e)
		if !inc {
			out = append(out, e)
			continue
		}
		changed = true
		target, why := "", "not an include git reads"
		if reads {
			target, why = s.includeTarget(x, from, e)
		}
		switch {
		case why != "":
		case slices.Contains(chain, target):
			why = "an include cycle"
		case depth >= maxIncludeDepth:
			why = fmt.Sprintf("includes nested over %d deep", maxIncludeDepth)
		case x.count >= maxIncludes:
			why = fmt.Sprintf("over %d included files", maxIncludes)
		}
		if target != "" {
			s.leaveOut(target, "included, left out")
		}
		var sub []configEntry
		if why == "" {
			var err error
			if sub, err = s.read(target); err != nil {
				if s.ctx.Err() != nil {
					return nil, false, s.ctx.Err()
				}
				why = "git cannot read " + target + " as a config"
			}
		}
		if why != "" {
			s.note(e.from + e.key() + " (" + why + ", dropped)")
			continue
		}
		x.count++
		s.note(e.from + e.key() + " (inlined: " + target + ")")
		for i := range sub {
			sub[i].from = target + ": "
		}
		sub, _, err := s.expand(x, target, sub, depth+1, append(chain[:len(chain):len(chain)], target))
		if err != nil {
			return nil, false, err
		}
		out = append(out, sub...)
	}
	return out, changed, nil
}

// includeTarget is the file of the copy an include entry of the file from
// names, or why it names none in the git directory.
func (s *scrub) includeTarget(x *expansion, from string, e configEntry) (string, string) {
	const outside = "outside the git directory"
	v := e.value
	var rel string
	switch {
	case e.noValue || v == "":
		return "", "no file named"
	case strings.HasPrefix(v, "~") || strings.HasPrefix(v, "%(prefix)"):
		return "", outside
	case path.IsAbs(v):
		var ok bool
		if rel, ok = s.onHost(v); !ok {
			return "", outside
		}
	default:
		rel = path.Join(path.Dir(from), v)
	}
	if !below(rel, x.gitDir) {
		return "", outside
	}
	if !s.plainFile(rel) {
		return "", rel + " is not a plain file"
	}
	return rel, ""
}

// onHost places an absolute host path in the copy, when it lies in the
// tree copied (judged by its text: nothing outside the tree is read).
func (s *scrub) onHost(p string) (string, bool) {
	if s.host == "" {
		return "", false
	}
	p = path.Clean(p)
	if s.host == "/" {
		return strings.TrimPrefix(p, "/"), p != "/"
	}
	return strings.CutPrefix(p, s.host+"/")
}

// below reports whether rel, a clean path of the copy, lies below dir.
func below(rel, dir string) bool {
	if rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
		return false
	}
	return dir == "." || strings.HasPrefix(rel, dir+"/")
}

// plainFile reports whether rel is a regular file of the copy, reached
// through no symlink.
func (s *scrub) plainFile(rel string) bool {
	st, err := lstatBeneath(s.root, rel)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// gitDirOf is the git directory holding the config rel: up to its last
// .git component, or the config's own directory (a bare repository).
func gitDirOf(rel string) string {
	dir := path.Dir(rel)
	parts := strings.Split(dir, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if parts[i] == ".git" {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return dir
}

// credentialFiles leaves out the credential stores of the git directory
// holding the config rel: those of git's own names, and the files in it a
// credential helper's command line names (relative to the work tree's
// top, where git runs it, or absolute).
func (s *scrub) credentialFiles(rel, gitDir string, entries []configEntry) {
	for _, d := range []string{gitDir, path.Dir(rel)} {
		for _, name := range storeNames {
			if p := path.Join(d, name); s.plainFile(p) {
				s.leaveOut(p, "a credential store, left out")
			}
		}
	}
	top := gitDir
	if path.Base(gitDir) == ".git" {
		top = path.Dir(gitDir)
	}
	for _, e := range entries {
		if e.section != "credential" || e.name != "helper" || e.noValue {
			continue
		}
		for _, w := range shellWords(e.value) {
			words := []string{w}
			if _, after, ok := strings.Cut(w, "="); ok {
				words = append(words, after)
			}
			for _, w := range words {
				p, ok := path.Join(top, w), !strings.HasPrefix(w, "~")
				if path.IsAbs(w) {
					p, ok = s.onHost(w)
				}
				if ok && below(p, gitDir) && s.plainFile(p) && !s.gitOwn(p) {
					s.leaveOut(p, "named by "+e.from+e.key()+", left out")
				}
			}
		}
	}
}

// gitOwn reports whether rel is a file git needs in the copy: a
// repository's config (cleaned on its own), HEAD or index.
func (s *scrub) gitOwn(rel string) bool {
	switch path.Base(rel) {
	case "HEAD", "index":
		return true
	}
	return s.repo[rel]
}

// leaveOut notes a file to remove from the copy, with why; the first
// reason stands.
func (s *scrub) leaveOut(rel, why string) {
	if s.gitOwn(rel) {
		return
	}
	if _, ok := s.drop[rel]; !ok {
		s.drop[rel] = why
	}
}

// shellWords splits a command line into words as a shell would, roughly:
// at blanks and at ; & | ( ) < > outside quotes, quotes and backslashes
// removed.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in := false // a word is open
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote == '\'':
			cur.WriteByte(c)
		case c == '\\' && i+1 < len(s) && (quote == 0 || strings.IndexByte(`"\$`+"`", s[i+1]) >= 0):
			i++
			cur.WriteByte(s[i])
			in = true
		case quote != 0:
			cur.WriteByte(c)
		case c == '\'' || c == '"':
			quote, in = c, true
		case strings.IndexByte(" \t\n;&|()<>", c) >= 0:
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
