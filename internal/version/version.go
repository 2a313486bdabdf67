// Package version is isopod's one version number. The number lives in the
// file VERSION beside this one, the only place to change it: the isopod and
// isopod-mcp binaries embed it, and .claude-plugin/plugin.json carries the
// same number (a test checks that they agree).
//
// A build of a commit that is not the release may append a suffix at link
// time, which scripts/install.sh and scripts/release.sh do (the release's
// packages carry the same version in their metadata):
//
//	go build -ldflags "-X isopod/internal/version.suffix=+g1a2b3c4d" ./cmd/isopod
package version

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var file string

// suffix is set at link time for a build of a non-release commit, as
// semver build metadata: "+g<commit>", "+g<commit>.dirty" or "+dirty".
var suffix string

// Release is the number in VERSION, e.g. "0.1.0".
func Release() string { return strings.TrimSpace(file) }

// String is the version the binaries report: Release, then the build
// suffix if there is one.
func String() string { return Release() + suffix }
