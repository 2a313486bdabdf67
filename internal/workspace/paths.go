//go:build linux

package workspace

// LeftOut reports whether a change to the path p is left out of a patch:
// it lies under .git.
func LeftOut(p string) bool { return underGit(p) }

// CheckPath refuses a change path that is not relative and clean, saying
// why; Patch refuses such a change the same way.
func CheckPath(p string) error { return checkPath(p) }
