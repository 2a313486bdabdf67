//go:build linux

package workspace

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// configEntry is one variable of a git config file, as `git config --list`
// names it: section and name lowercased, the subsection as written.
type configEntry struct {
	section, sub, name string
	hasSub             bool
	value              string
	noValue            bool // a bare "name", which reads as true
}

func (e configEntry) key() string {
	if e.hasSub {
		return e.section + "." + e.sub + "." + e.name
	}
	return e.section + "." + e.name
}

// isGitConfig reports whether rel, a file of the staging copy named config
// or config.worktree, is a repository's configuration: its directory holds
// HEAD and objects (a git directory) or commondir (a worktree's).
func isGitConfig(stage, rel string) bool {
	dir := filepath.Join(stage, filepath.Dir(rel))
	if fi, err := os.Lstat(filepath.Join(dir, "HEAD")); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	if fi, err := os.Lstat(filepath.Join(dir, "objects")); err == nil && fi.IsDir() {
		return true
	}
	fi, err := os.Lstat(filepath.Join(dir, "commondir"))
	return err == nil && fi.Mode().IsRegular()
}

// scrubConfigs removes credentials from every repository configuration the
// copy holds and returns what it removed. Without git on the host such a
// file cannot be read safely and is removed whole.
func scrubConfigs(ctx context.Context, git, stage string, configs []string) ([]string, error) {
	var removed []string
	seen := map[string]bool{}
	for _, rel := range configs {
		if !isGitConfig(stage, rel) {
			continue
		}
		label := ""
		if rel != ".git/config" {
			label = rel + ": "
		}
		var keys []string
		if git == "" {
			if err := os.Remove(filepath.Join(stage, rel)); err != nil {
				return nil, fmt.Errorf("removing %s from the copy: %w", rel, err)
			}
			keys = []string{"(the whole file: git is not installed to read it)"}
		} else {
			var err error
			if keys, err = scrubConfig(ctx, git, filepath.Join(stage, rel)); err != nil {
				return nil, fmt.Errorf("removing credentials from the copy of %s: %w", rel, err)
			}
		}
		for _, k := range keys {
			if s := label + k; !seen[s] {
				seen[s] = true
				removed = append(removed, s)
			}
		}
	}
	return removed, nil
}

// scrubConfig rewrites the config file at path without the credentials it
// holds and returns their key names. A file with none is left as it was.
func scrubConfig(ctx context.Context, git, path string) ([]string, error) {
	cmd := exec.CommandContext(ctx, git, "config", "--file", path, "--list", "--null")
	cmd.Dir = filepath.Dir(path)
	cmd.Env = gitEnv("GIT_CONFIG_NOSYSTEM=1")
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git config: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	entries, err := parseConfigList(out)
	if err != nil {
		return nil, err
	}
	kept, removed := filterConfig(entries)
	if len(removed) == 0 {
		return nil, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, formatConfig(kept), fi.Mode().Perm()); err != nil {
		return nil, err
	}
	return removed, os.Chtimes(path, fi.ModTime(), fi.ModTime())
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
				removed = append(removed, e.key()+" (user info in its name)")
			}
		}
		switch {
		case e.section == "credential":
			removed = append(removed, e.key())
			continue
		case e.section == "http" && e.name == "extraheader":
			removed = append(removed, e.key())
			continue
		case secretName(e.name):
			removed = append(removed, e.key())
			continue
		}
		if v, ok := stripUserinfo(e.value, e.name == "proxy"); ok {
			e.value = v
			removed = append(removed, e.key()+" (user info)")
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
