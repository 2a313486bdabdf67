//go:build linux

package jail

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// helperName is the dedicated jail helper's program (cmd/isopod-jail).
const helperName = "isopod-jail"

// packagedHelper is where the release packages install it, beside the
// guest agent.
const packagedHelper = "/usr/lib/isopod/" + helperName

// findHelper returns the dedicated helper this Jailer starts for every VMM:
// isopod-jail beside the running program (symlinks resolved), else in the
// lib/isopod of the prefix it is installed in (a release tarball), else
// the packaged one, the first that is usable; "" when there is none, and
// every VMM's helper is then this program re-executed. Why a candidate
// that exists was passed over goes to skipped.
func findHelper(self string, candidates []string, euid int, skipped func(path string, err error)) string {
	if self != "" {
		if real, err := filepath.EvalSymlinks(self); err == nil {
			dir := filepath.Dir(real)
			candidates = append([]string{filepath.Join(dir, helperName),
				filepath.Join(filepath.Dir(dir), "lib", "isopod", helperName)}, candidates...)
		}
	}
	for _, c := range candidates {
		st, err := os.Stat(c)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = helperUsable(st, euid)
		}
		if err != nil {
			skipped(c, err)
			continue
		}
		return c
	}
	return ""
}

// helperUsable accepts a helper only if nobody but root or this user can
// have put it there: a regular file owned by either and not writable by
// group or others. (The program it would replace, isopod itself, is
// trusted as it stands.)
func helperUsable(st fs.FileInfo, euid int) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file")
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner")
	}
	if sys.Uid != 0 && int(sys.Uid) != euid {
		return fmt.Errorf("owned by uid %d, neither root nor %d", sys.Uid, euid)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("writable by group or others (mode %04o)", st.Mode().Perm())
	}
	if st.Mode().Perm()&0o100 == 0 {
		return fmt.Errorf("not executable by its owner (mode %04o)", st.Mode().Perm())
	}
	return nil
}

// Helper is the dedicated helper program that starts every VMM in its
// jail, or "" when this program re-executes itself instead.
func (j *Jailer) Helper() string { return j.helper }

// HelpersPassedOver say which helper programs exist but were not used,
// and why.
func (j *Jailer) HelpersPassedOver() []string { return append([]string(nil), j.passed...) }

// openHelper opens the program the helper process executes: the dedicated
// helper, checked again on the opened file, or this program.
func (j *Jailer) openHelper() (*os.File, error) {
	path := j.helper
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("jail: finding this program to re-execute: %w", err)
		}
		path = self
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("jail: opening %s: %w", path, err)
	}
	if j.helper == "" {
		return f, nil
	}
	st, err := f.Stat()
	if err == nil {
		err = helperUsable(st, os.Geteuid())
	}
	if err != nil {
		f.Close()
		return nil, failed(fmt.Sprintf("the jail helper %s changed since isopod started: %v", path, err), "reinstall isopod")
	}
	return f, nil
}

// helperLabel names the helper in logs and reports.
func helperLabel(path string) string {
	if path == "" {
		return "this program, re-executed"
	}
	return path
}
