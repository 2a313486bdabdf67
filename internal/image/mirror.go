package image

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"pault.ag/go/debian/control"

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

// parseDeb822Sources reads the stanzas of a .sources file. Field names are
// case-insensitive there, so they are folded to lower case.
func parseDeb822Sources(path string) ([]aptSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pr, err := control.NewParagraphReader(f, nil)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var out []aptSource
	for {
		para, err := pr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		st := map[string]string{}
		for k, v := range para.Values {
			st[strings.ToLower(k)] = v
		}
		if strings.EqualFold(strings.TrimSpace(st["enabled"]), "no") || !slices.Contains(strings.Fields(st["types"]), "deb") {
			continue
		}
		for _, u := range strings.Fields(st["uris"]) {
			out = append(out, aptSource{URI: u, Suites: strings.Fields(st["suites"])})
		}
	}
}
