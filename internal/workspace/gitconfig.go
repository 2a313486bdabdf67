//go:build linux

package workspace

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// configEntry is one variable of a git config file, as `git config --list`
// names it: section and name lowercased, the subsection as written.
type configEntry struct {
	section, sub, name string
	hasSub             bool
	value              string
	noValue            bool // a bare "name", which reads as true
	// from prefixes the entry's name in the report: "" for .git/config,
	// else the file it came from and ": ".
	from string
}

func (e configEntry) key() string {
	if e.hasSub {
		return e.section + "." + e.sub + "." + e.name
	}
	return e.section + "." + e.name
}

// isGitConfig reports whether rel, named config or config.worktree in
// the staging copy open as root, is a repository's configuration: its
// directory holds HEAD and objects (a git directory) or commondir (a
// worktree's).
func isGitConfig(root int, rel string) bool {
	dir := path.Dir(rel)
	is := func(name string, mode uint32) bool {
		st, err := lstatBeneath(root, path.Join(dir, name))
		return err == nil && st.Mode&unix.S_IFMT == mode
	}
	return is("HEAD", unix.S_IFREG) && (is("objects", unix.S_IFDIR) || is("commondir", unix.S_IFREG))
}

// scrub removes credentials from the repository configs of a staging
// copy, and the files git would read them from besides.
type scrub struct {
	ctx  context.Context
	git  string
	root int    // the staging copy, open
	host string // the tree's path on the host, "" when unknown
	// repo are the repository configs, cleaned each on its own.
	repo map[string]bool
	// drop are the files to leave out of the copy, and why.
	drop    map[string]string
	removed []string
	seen    map[string]bool
}

// scrubbed is what a scrub removed: names for the report, and the files it
// left out and their bytes.
type scrubbed struct {
	names        []string
	files, bytes int64
}

// scrubConfigs removes credentials from every repository configuration the
// copy at stage holds, and the files they include or keep credentials in,
// and returns what it removed. host is the tree's path on the host, to
// place absolute paths ("" when unknown). Without git on the host such a
// config cannot be read safely and is removed whole.
func scrubConfigs(ctx context.Context, git, stage, host string, configs []string) (scrubbed, error) {
	root, err := unix.Open(stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return scrubbed{}, fmt.Errorf("opening the workspace copy: %w", err)
	}
	defer unix.Close(root)
	s := &scrub{ctx: ctx, git: git, root: root, host: host,
		repo: map[string]bool{}, drop: map[string]string{}, seen: map[string]bool{}}
	var repo []string
	for _, rel := range configs {
		if isGitConfig(root, rel) {
			s.repo[rel] = true
			repo = append(repo, rel)
		}
	}
	for _, rel := range repo {
		if err := s.config(rel); err != nil {
			return scrubbed{}, fmt.Errorf("removing credentials from the copy of %s: %w", rel, err)
		}
	}
	return s.leaveOutAll()
}

// note adds a name to the report, once.
func (s *scrub) note(name string) {
	if !s.seen[name] {
		s.seen[name] = true
		s.removed = append(s.removed, name)
	}
}

// config cleans the repository config rel: its includes inlined or
// dropped, then its credentials removed. A file with neither is left as it
// was. A config that is a symlink is replaced by a cleaned copy of the file
// of the copy it points at, or left out when it points at none.
func (s *scrub) config(rel string) error {
	label := ""
	if rel != ".git/config" {
		label = rel + ": "
	}
	x := &expansion{gitDir: gitDirOf(rel)}
	if s.git == "" {
		s.credentialFiles(rel, x.gitDir, nil)
		if _, err := removeBeneath(s.root, rel); err != nil {
			return err
		}
		s.note(label + "(the whole file: git is not installed to read it)")
		return nil
	}
	from, err := s.configFile(rel, x.gitDir, label)
	if from == "" || err != nil {
		return err
	}
	st, err := lstatBeneath(s.root, from)
	if err != nil {
		return err
	}
	entries, err := s.read(from)
	if err != nil {
		return err
	}
	for i := range entries {
		entries[i].from = label
	}
	entries, changed, err := s.expand(x, rel, entries, 0, []string{rel, from})
	if err != nil {
		return err
	}
	s.credentialFiles(rel, x.gitDir, entries)
	kept, removed := filterConfig(entries)
	for _, r := range removed {
		s.note(r)
	}
	if len(removed) == 0 && !changed && from == rel {
		return nil
	}
	return replaceBeneath(s.root, rel, formatConfig(kept), st.Mode&0o777, st.Mtim)
}

// configFile is the file the config rel is read from: rel itself, or the
// file of the copy a symlink there points at. A link pointing at none is
// removed, and "" returned.
func (s *scrub) configFile(rel, gitDir, label string) (string, error) {
	st, err := lstatBeneath(s.root, rel)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return rel, err
	}
	target, err := readlinkBeneath(s.root, rel)
	if err != nil {
		return "", err
	}
	p, ok := path.Join(path.Dir(rel), target), true
	if path.IsAbs(target) {
		p, ok = s.onHost(target)
	}
	if !ok || !below(p, ".") || !s.plainFile(p) {
		s.note(label + "(a symlink to no file of the copy, left out)")
		_, err := removeBeneath(s.root, rel)
		return "", err
	}
	s.note(label + "(a symlink to " + p + ", replaced by a cleaned copy)")
	if below(p, gitDir) {
		s.leaveOut(p, "a config's symlink target, left out")
	}
	return p, nil
}

// read lists the entries of the config file rel of the copy, reached
// through no symlink, with git, which follows none of its includes.
func (s *scrub) read(rel string) ([]configEntry, error) {
	f, err := openBeneath(s.root, rel, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", rel)
	}
	// Read from stdin, git follows includes unless told not to.
	cmd := exec.CommandContext(s.ctx, s.git, "config", "--no-includes", "--file", "-", "--list", "--null")
	cmd.Dir, cmd.Stdin = "/", f
	cmd.Env = gitEnv("GIT_CONFIG_NOSYSTEM=1")
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git config: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseConfigList(out)
}

// leaveOutAll removes the files noted to leave out, in path order, and
// reports them after the names of the settings removed.
func (s *scrub) leaveOutAll() (scrubbed, error) {
	out := scrubbed{}
	paths := make([]string, 0, len(s.drop))
	for p := range s.drop {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		n, err := removeBeneath(s.root, p)
		if err != nil {
			return scrubbed{}, fmt.Errorf("leaving %s out of the workspace copy: %w", p, err)
		}
		out.files++
		out.bytes += n
		s.note(p + " (" + s.drop[p] + ")")
	}
	out.names = s.removed
	return out, nil
}

// parseConfigList reads `git config --list --null`: records ended by NUL,
// each a key, then a newline and the value unless the variable is bare.
func parseConfigList(out []byte) ([]configEntry, error) {
	var entries []configEntry
	for _, rec := range strings.Split(string(out), "\x00") {
		if rec == "" {
			continue
		}
		key, value, hasValue := strings.Cut(rec, "\n")
		first, last := strings.Index(key, "."), strings.LastIndex(key, ".")
		if first <= 0 || last == len(key)-1 {
			return nil, fmt.Errorf("git config listed a malformed key %q", key)
		}
		e := configEntry{section: key[:first], name: key[last+1:], value: value, noValue: !hasValue}
		if first != last {
			e.sub, e.hasSub = key[first+1:last], true
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// filterConfig drops what may hold a credential and strips user info from
// URLs, returning what is kept and the names of what was removed.
func filterConfig(entries []configEntry) (kept []configEntry, removed []string) {
	for _, e := range entries {
		if e.hasSub {
			if s, ok := stripUserinfo(e.sub, false); ok {
				e.sub = s
				removed = append(removed, e.from+e.key()+" (user info in its name)")
			}
		}
		switch {
		case e.section == "credential":
			removed = append(removed, e.from+e.key())
			continue
		case e.section == "http" && e.name == "extraheader":
			removed = append(removed, e.from+e.key())
			continue
		case secretName(e.name):
			removed = append(removed, e.from+e.key())
			continue
		}
		if v, ok := stripUserinfo(e.value, e.name == "proxy"); ok {
			e.value = v
			removed = append(removed, e.from+e.key()+" (user info)")
		}
		kept = append(kept, e)
	}
	return kept, removed
}

// secretName reports whether a variable's name says it holds a secret
// (sendemail.smtppass, a tool's token).
func secretName(name string) bool {
	for _, w := range []string{"pass", "token", "secret"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// stripUserinfo removes user info from a URL: all of it for the web
// schemes, where a token often stands in the user name, and only a password
// for the others (ssh://git@host keeps its account name). schemeless also
// treats "user:pass@host:port" (a proxy) as a URL.
func stripUserinfo(s string, schemeless bool) (string, bool) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || strings.ContainsAny(scheme, "/@:") {
		if !schemeless {
			return s, false
		}
		scheme, rest = "", s
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return s, false
	}
	user, host := rest[:at], rest[at+1:]
	prefix := ""
	if scheme != "" {
		prefix = scheme + "://"
	}
	switch strings.ToLower(scheme) {
	case "http", "https", "ftp", "ftps", "":
		return prefix + host, true
	}
	name, _, hasPass := strings.Cut(user, ":")
	if !hasPass {
		return s, false
	}
	return prefix + name + "@" + host, true
}

// formatConfig writes entries back as a config file, every value quoted.
func formatConfig(entries []configEntry) []byte {
	var b bytes.Buffer
	cur := ""
	for _, e := range entries {
		hdr := "[" + e.section + "]\n"
		if e.hasSub {
			hdr = "[" + e.section + " \"" + escapeConfig(e.sub, false) + "\"]\n"
		}
		if hdr != cur {
			b.WriteString(hdr)
			cur = hdr
		}
		if e.noValue {
			fmt.Fprintf(&b, "\t%s\n", e.name)
		} else {
			fmt.Fprintf(&b, "\t%s = \"%s\"\n", e.name, escapeConfig(e.value, true))
		}
	}
	return b.Bytes()
}

// escapeConfig escapes a subsection name, or a quoted value.
func escapeConfig(s string, value bool) string {
	r := []string{`\`, `\\`, `"`, `\"`}
	if value {
		r = append(r, "\n", `\n`, "\t", `\t`, "\b", `\b`)
	}
	return strings.NewReplacer(r...).Replace(s)
}
