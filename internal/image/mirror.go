package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"isopod/internal/errdefs"
)

// aptSource is one "deb" entry of the host's apt configuration.
type aptSource struct {
	URI    string
	Suites []string
}

// hostMirror returns the URI of the first enabled "deb" source in the apt
// configuration under etcApt (normally /etc/apt) that serves suite.
func hostMirror(etcApt, suite string) (string, error) {
	srcs, err := hostSources(etcApt)
	if err != nil {
		return "", err
	}
	for _, s := range srcs {
		for _, su := range s.Suites {
			if su == suite {
				return strings.TrimRight(s.URI, "/"), nil
			}
		}
	}
	return "", fmt.Errorf("no apt source for %s in %s (sources.list or sources.list.d); configure one or pass a mirror explicitly: %w",
		suite, etcApt, errdefs.ErrFailedPrecondition)
}

// sourcesListFor writes a sources.list (main only) with the host's sources
// for suite, suite-updates and suite-security, falling back to mirror for
// suite itself.
func sourcesListFor(etcApt, mirror, suite string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "deb %s %s main\n", mirror, suite)
	srcs, _ := hostSources(etcApt)
	seen := map[string]bool{}
	for _, s := range srcs {
		for _, su := range s.Suites {
			line := fmt.Sprintf("deb %s %s main\n", strings.TrimRight(s.URI, "/"), su)
			if (su == suite+"-updates" || su == suite+"-security") && !seen[line] {
				seen[line] = true
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// hostSources lists the enabled "deb" sources under etcApt.
func hostSources(etcApt string) ([]aptSource, error) {
	var files []string
	if _, err := os.Stat(filepath.Join(etcApt, "sources.list")); err == nil {
		files = append(files, filepath.Join(etcApt, "sources.list"))
	}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		sort.Strings(m)
		files = append(files, m...)
	}
	var all []aptSource
	for _, f := range files {
		var srcs []aptSource
		var err error
		if strings.HasSuffix(f, ".sources") {
			srcs, err = parseDeb822Sources(f)
		} else {
			srcs, err = parseOneLineSources(f)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, srcs...)
	}
	return all, nil
}

// parseOneLineSources reads "deb [options] URI suite component..." lines.
func parseOneLineSources(path string) ([]aptSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []aptSource
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "deb" {
			continue
		}
		rest := fields[1:]
		if strings.HasPrefix(rest[0], "[") {
			for len(rest) > 0 && !strings.HasSuffix(rest[0], "]") {
				rest = rest[1:]
			}
			if len(rest) > 0 {
				rest = rest[1:]
			}
		}
		if len(rest) < 2 {
			continue
		}
		out = append(out, aptSource{URI: rest[0], Suites: []string{rest[1]}})
	}
	return out, sc.Err()
}

// parseDeb822Sources reads the stanzas of a .sources file.
func parseDeb822Sources(path string) ([]aptSource, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []aptSource
	flush := func(st map[string]string) {
		if len(st) == 0 || strings.EqualFold(st["enabled"], "no") {
			return
		}
		isDeb := false
		for _, t := range strings.Fields(st["types"]) {
			isDeb = isDeb || t == "deb"
		}
		if !isDeb {
			return
		}
		for _, u := range strings.Fields(st["uris"]) {
			out = append(out, aptSource{URI: u, Suites: strings.Fields(st["suites"])})
		}
	}
	st := map[string]string{}
	last := ""
	for _, raw := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(raw, "#") {
			continue
		}
		if strings.TrimSpace(raw) == "" {
			flush(st)
			st, last = map[string]string{}, ""
			continue
		}
		if raw[0] == ' ' || raw[0] == '\t' {
			if last != "" {
				st[last] += " " + strings.TrimSpace(raw)
			}
			continue
		}
		k, v, ok := strings.Cut(raw, ":")
		if !ok {
			continue
		}
		last = strings.ToLower(strings.TrimSpace(k))
		st[last] = strings.TrimSpace(v)
	}
	flush(st)
	return out, nil
}
