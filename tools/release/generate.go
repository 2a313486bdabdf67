package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// generate writes the files this program makes into dir and returns dir.
func (r *Release) generate(ctx context.Context, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lic, err := os.ReadFile(filepath.Join(r.Src, "LICENSE"))
	if err != nil {
		return "", fmt.Errorf("reading the licence: %w", err)
	}
	changelog, err := gz(r.changelog())
	if err != nil {
		return "", err
	}
	notices := r.notices
	if notices == nil {
		notices = goNotices
	}
	var bins []string
	for _, n := range binaries {
		bins = append(bins, filepath.Join(r.Bin, n))
	}
	text, err := notices(ctx, bins)
	if err != nil {
		return "", fmt.Errorf("collecting the licences of what the binaries link: %w", err)
	}
	noticesGz, err := gz(text)
	if err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{
		genCopyright: debCopyright(lic),
		genChangelog: changelog,
		genNotices:   noticesGz,
		genLintian:   []byte(lintianOverrides),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// debCopyright is /usr/share/doc/isopod/copyright in Debian's
// machine-readable format: the MIT licence (Debian calls it Expat), and a
// pointer to the notices of the Go modules linked into the binaries.
func debCopyright(licence []byte) []byte {
	var b bytes.Buffer
	b.WriteString("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
	b.WriteString("Upstream-Name: isopod\n")
	b.WriteString("Comment: The binaries also contain the Go standard library and Go modules\n")
	b.WriteString(" under their own licences; /usr/share/doc/isopod/third-party-notices.gz\n")
	b.WriteString(" holds each one's licence and notices.\n\n")
	b.WriteString("Files: *\nCopyright: the isopod authors\nLicense: Expat\n")
	// The licence text without its title and copyright line, one space in,
	// with blank lines as " .".
	lines := strings.Split(strings.TrimSpace(string(licence)), "\n")
	var body []string
	for _, l := range lines {
		if strings.HasPrefix(l, "MIT License") || strings.HasPrefix(l, "Copyright") {
			continue
		}
		body = append(body, l)
	}
	for len(body) > 0 && strings.TrimSpace(body[0]) == "" {
		body = body[1:]
	}
	for _, l := range body {
		if strings.TrimSpace(l) == "" {
			b.WriteString(" .\n")
			continue
		}
		b.WriteString(" " + l + "\n")
	}
	return b.Bytes()
}

// changelog is the one-entry Debian changelog of a native package: this
// release, dated at the commit.
func (r *Release) changelog() []byte {
	return fmt.Appendf(nil, "%s (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- %s  %s\n",
		pkgName, r.Version, r.Commit, maintainer, r.mtime().Format("Mon, 02 Jan 2006 15:04:05 -0700"))
}

// lintianOverrides are the lintian tags isopod's .deb carries on purpose.
// Lintian excuses static Go binaries only in packages built from a Debian
// source package that build-depends on Go; these are built by scripts/release.sh.
const lintianOverrides = `# Go binaries, built with CGO_ENABLED=0 so that one build runs on every
# distribution; the guest agent must be static (the initramfs has no loader),
# and so is the jail helper.
isopod: statically-linked-binary [usr/bin/isopod]
isopod: statically-linked-binary [usr/bin/isopod-mcp]
isopod: statically-linked-binary [usr/lib/isopod/isopod-agent]
isopod: statically-linked-binary [usr/lib/isopod/isopod-jail]
`

// gz compresses b at the best level with an empty header (no name, no
// time), so the same bytes always give the same file.
func gz(b []byte) ([]byte, error) {
	var out bytes.Buffer
	w, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
