package main

import (
	"io/fs"
	"path"
)

// format is one kind of artifact.
type format string

const (
	formatDeb format = "deb"
	formatRPM format = "rpm"
	formatTar format = "tar"
)

// Where things go, relative to the prefix: /usr for the packages, the
// tarball's top directory for the tarball (which is laid out as a prefix,
// so that it can be unpacked under /usr/local or ~/.local as it is).
const (
	binDir     = "bin"          // isopod, isopod-mcp
	libDir     = "lib/isopod"   // the static guest agent and jail helper
	shareDir   = "share/isopod" // the Claude Code plugin root: plugin, marketplace, launcher, skill
	docDir     = "share/doc/isopod"
	rpmLicence = "share/licenses/isopod"
	lintianDir = "share/lintian/overrides"
)

// origin says where a file's bytes come from.
type origin int

const (
	fromBin       origin = iota // the -bin directory
	fromSrc                     // the source tree
	fromGenerated               // made by this program (see Release.generate)
)

// file is one file of the release.
type file struct {
	dst  string // path under the prefix
	from origin
	src  string // path under -bin or -src, or the generated file's name
	mode fs.FileMode
	// only limits the file to one format; "" puts it in every one.
	only format
}

// Names of the generated files.
const (
	genCopyright  = "copyright"
	genChangelog  = "changelog.gz"
	genNotices    = "third-party-notices.gz"
	genLintian    = "lintian-overrides"
	genLicenceTxt = "LICENSE"
)

// releaseFiles is the whole release, in one table that every format reads.
func releaseFiles() []file {
	doc := func(src string) file {
		return file{dst: path.Join(docDir, src), from: fromSrc, src: src, mode: 0o644}
	}
	return []file{
		{dst: path.Join(binDir, "isopod"), from: fromBin, src: "isopod", mode: 0o755},
		{dst: path.Join(binDir, "isopod-mcp"), from: fromBin, src: "isopod-mcp", mode: 0o755},
		{dst: path.Join(libDir, "isopod-agent"), from: fromBin, src: "isopod-agent", mode: 0o755},
		{dst: path.Join(libDir, "isopod-jail"), from: fromBin, src: "isopod-jail", mode: 0o755},

		{dst: path.Join(shareDir, ".claude-plugin/plugin.json"), from: fromSrc, src: ".claude-plugin/plugin.json", mode: 0o644},
		{dst: path.Join(shareDir, ".claude-plugin/marketplace.json"), from: fromSrc, src: ".claude-plugin/marketplace.json", mode: 0o644},
		{dst: path.Join(shareDir, ".claude-plugin/isopod-mcp"), from: fromSrc, src: ".claude-plugin/isopod-mcp", mode: 0o755},
		{dst: path.Join(shareDir, "skill/SKILL.md"), from: fromSrc, src: "skill/SKILL.md", mode: 0o644},

		doc("README.md"),
		doc("SECURITY.md"),
		doc("BENCHMARKS.md"),
		doc("docs/architecture.md"),
		doc("docs/mcp-usage.md"),
		doc("docs/egress-ledger.md"),
		doc("docs/credentials.md"),
		{dst: path.Join(docDir, genNotices), from: fromGenerated, src: genNotices, mode: 0o644},

		// The licence, as each format expects it.
		{dst: path.Join(docDir, "copyright"), from: fromGenerated, src: genCopyright, mode: 0o644, only: formatDeb},
		{dst: path.Join(docDir, "changelog.gz"), from: fromGenerated, src: genChangelog, mode: 0o644, only: formatDeb},
		{dst: path.Join(lintianDir, "isopod"), from: fromGenerated, src: genLintian, mode: 0o644, only: formatDeb},
		{dst: path.Join(rpmLicence, "LICENSE"), from: fromSrc, src: "LICENSE", mode: 0o644, only: formatRPM},
		{dst: path.Join(docDir, "LICENSE"), from: fromSrc, src: "LICENSE", mode: 0o644, only: formatTar},
	}
}

// ownedDirs are the directories the packages own (and so remove), every
// parent of a file that is isopod's alone.
func ownedDirs(f format) []string {
	dirs := []string{
		libDir, shareDir, path.Join(shareDir, ".claude-plugin"), path.Join(shareDir, "skill"),
		docDir, path.Join(docDir, "docs"),
	}
	if f == formatRPM {
		dirs = append(dirs, rpmLicence)
	}
	return dirs
}

// filesFor is the table's part that goes into f.
func filesFor(f format) []file {
	var out []file
	for _, fl := range releaseFiles() {
		if fl.only == "" || fl.only == f {
			out = append(out, fl)
		}
	}
	return out
}
