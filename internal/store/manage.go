package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// CheckBase checks that every stage in chain was made over the base the
// run will use. A different flavor is errdefs.ErrInvalidArgument and cannot
// be overridden. A different build of the flavor (base_sha256 differing
// from currentSHA) is errdefs.ErrFailedPrecondition naming both builds and
// both ways out, or only a warning when allowSkew. Stages (or an installed
// base) without a recorded build id produce warnings.
func CheckBase(chain []Meta, flavor, currentSHA string, allowSkew bool) (warnings []string, err error) {
	var skewed []string
	for _, m := range chain {
		if m.BaseFlavor != flavor {
			return nil, fmt.Errorf("stage %s was made over base flavor %q but this run uses %q; a chain keeps one base flavor: "+
				"run with --base %s, or rebuild the stage from `--stage %s --base %s`: %w",
				m, m.BaseFlavor, flavor, m.BaseFlavor, BaseRef, flavor, errdefs.ErrInvalidArgument)
		}
		switch {
		case m.BaseSHA256 == "":
			warnings = append(warnings, fmt.Sprintf("stage %s records no base build id; it cannot be checked against the installed %s build %s",
				m, flavor, orUnknown(currentSHA)))
		case currentSHA == "":
			warnings = append(warnings, fmt.Sprintf("the installed %s base has no build id; stage %s (made over build %s) cannot be checked",
				flavor, m, m.BaseSHA256))
		case m.BaseSHA256 != currentSHA:
			msg := fmt.Sprintf("stage %s was made over %s build %s, but the installed build is %s",
				m, flavor, m.BaseSHA256, currentSHA)
			if allowSkew {
				warnings = append(warnings, msg+" (allowed by "+knobs.AllowBaseSkew+"=1)")
			} else {
				skewed = append(skewed, msg)
			}
		}
	}
	if len(skewed) > 0 {
		return warnings, fmt.Errorf("%s; rebuild the stage from a fresh `--stage %s` run, or set %s=1 to use it anyway: %w",
			strings.Join(skewed, "; "), BaseRef, knobs.AllowBaseSkew, errdefs.ErrFailedPrecondition)
	}
	return warnings, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// Remove deletes the stage ref names and returns its meta. It is refused
// with errdefs.ErrFailedPrecondition while other stages' chains use it
// (remove those first, leaf first). The directory is first renamed to a
// temporary name, so an interrupted removal leaves nothing List shows.
func (s *Store) Remove(ctx context.Context, ref string) (Meta, error) {
	m, err := s.Resolve(ref)
	if err != nil {
		return Meta{}, err
	}
	if m.IsBase() {
		return Meta{}, fmt.Errorf("%q is the built-in empty stage and cannot be removed: %w", BaseRef, errdefs.ErrInvalidArgument)
	}
	release, err := s.lock(ctx)
	if err != nil {
		return Meta{}, err
	}
	defer release()
	all, err := s.List()
	if err != nil {
		return Meta{}, err
	}
	var users []string
	for _, o := range all {
		if o.ID != m.ID && slices.Contains(o.Chain, m.ID) {
			users = append(users, o.String())
		}
	}
	if len(users) > 0 {
		return Meta{}, fmt.Errorf("stage %s is a layer of %s; remove those first, leaf first: %w",
			m, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	dir := filepath.Join(s.dir, m.ID)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return Meta{}, fmt.Errorf("stage %s: %w", m.ID, errdefs.ErrNotFound)
	}
	doomed, err := os.MkdirTemp(s.dir, tmpPrefix+"rm-"+m.ID+"-")
	if err != nil {
		return Meta{}, fmt.Errorf("removing stage: %w", err)
	}
	target := filepath.Join(doomed, m.ID)
	if err := os.Rename(dir, target); err != nil {
		_ = os.Remove(doomed)
		return Meta{}, fmt.Errorf("removing stage %s: %w", m.ID, err)
	}
	if err := syncDir(s.dir); err != nil {
		s.log.Warn("syncing stages directory", "err", err)
	}
	if err := os.RemoveAll(doomed); err != nil {
		s.log.Warn("removing stage files (gc will retry)", "dir", doomed, "err", err)
	}
	return m, nil
}

// GC removes leftovers of interrupted commits and removals: temporary
// directories older than a minute whose commit lock nobody holds, and at
// once those whose writer died (abandoned). It returns the removed
// directory names.
func (s *Store) GC(ctx context.Context) (removed []string, err error) {
	return s.gc(ctx, time.Now().Add(-gcMinAge))
}

func (s *Store) gc(ctx context.Context, cutoff time.Time) ([]string, error) {
	release, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing stages: %w", err)
	}
	var removed []string
	for _, e := range ents {
		if !isTemp(e.Name()) {
			continue
		}
		path := filepath.Join(s.dir, e.Name())
		info, err := e.Info()
		if err != nil || (info.ModTime().After(cutoff) && !abandoned(path)) {
			continue
		}
		if busy, err := commitBusy(path); err != nil {
			s.log.Warn("checking commit lock", "dir", path, "err", err)
			continue
		} else if busy {
			continue
		}
		if err := os.RemoveAll(path); err != nil {
			return removed, fmt.Errorf("removing %s: %w", path, err)
		}
		removed = append(removed, e.Name())
	}
	sort.Strings(removed)
	return removed, nil
}

// commitBusy reports whether a live commit holds the lock in dir.
// lockGrace is how old a temporary directory's lock file must be before
// an unheld lock says its writer is gone. A writer takes the lock within
// microseconds of making the directory and holds it until the directory
// is published or removed.
const lockGrace = 2 * time.Second

// abandoned reports whether dir, though younger than GC's minimum age,
// was left by a writer that died: its lock file is older than lockGrace
// and nobody holds it. Such a leftover (a commit killed a moment ago) is
// collected at once, not a minute later.
func abandoned(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, ".lock"))
	if err != nil || time.Since(fi.ModTime()) < lockGrace {
		return false
	}
	busy, err := commitBusy(dir)
	return err == nil && !busy
}

func commitBusy(dir string) (bool, error) {
	path := filepath.Join(dir, ".lock")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	fl := flock.New(path)
	ok, err := fl.TryLock()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("probing %s: %w", path, err)
	}
	if ok {
		_ = fl.Close()
	}
	return !ok, nil
}
