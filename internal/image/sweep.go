package image

import (
	"isopod/internal/paths"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TempMaxAge is how old a build's temporary entry must be before SweepTemp
// removes it: far longer than any fetch or build runs, so the entries of
// one still at work are never touched. (Builds take their locks only to
// publish, so age is what tells a dead build from a live one.)
const TempMaxAge = 6 * time.Hour

// tempPrefixes name what fetches and builds write before publishing.
var tempPrefixes = []string{".tmp-", ".download-"}

// SweepTemp removes what interrupted kernel fetches and image builds left
// in kernels/ and images/: entries named .tmp-* or .download-* last
// modified more than maxAge ago. Mounts a build left below an entry are
// detached first; an entry that still has one is kept. It returns the
// paths it removed.
func SweepTemp(paths paths.Paths, maxAge time.Duration, log *slog.Logger) []string {
	log = logger(log)
	var removed []string
	for _, dir := range []string{paths.Kernels(), paths.Images()} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !hasTempPrefix(e.Name()) {
				continue
			}
			info, err := e.Info()
			if err != nil || time.Since(info.ModTime()) < maxAge {
				continue
			}
			path := filepath.Join(dir, e.Name())
			unmountUnder(path, log)
			if left := mountsUnder(path); len(left) > 0 {
				log.Warn("keeping an interrupted build's directory: it still has mounts", "path", path, "mounts", left)
				continue
			}
			if err := os.RemoveAll(path); err != nil {
				log.Warn("removing an interrupted build's leftovers", "path", path, "err", err)
				continue
			}
			removed = append(removed, path)
		}
	}
	return removed
}

func hasTempPrefix(name string) bool {
	for _, p := range tempPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
