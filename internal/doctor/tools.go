package doctor

import (
	"fmt"
	"strings"

	"isopod/internal/hosttool"
)

// hostTools are the host programs isopod starts besides QEMU (and the
// jail's, which the jail check tries), with what each is for. Runs fail
// without a required one.
var hostTools = []struct {
	name, use string
	required  bool
}{
	{"mkfs.ext4", "makes the scratch disk template of each size a run asks for", true},
	{"mksquashfs", "builds images and packs workspaces", false},
	{"debugfs", "reads stage layers (stage diffs and pushes)", false},
	{"git", "lists and diffs workspaces in git repositories", false},
}

// checkTools finds the host programs runs and image builds start, where
// hosttool.Find does (PATH, then the sbin directories), and names the
// package of each missing one.
func checkTools(h Host) Check {
	c := Check{Name: "tools", Required: true}
	if h.LookPath == nil {
		c.Why = "cannot look for programs on this host"
		return c
	}
	found := map[string]any{}
	var missing, fixes []string
	c.OK = true
	for _, t := range hostTools {
		p, err := h.LookPath(t.name)
		if err == nil {
			found[t.name] = p
			continue
		}
		if t.required {
			c.OK = false
		}
		missing = append(missing, fmt.Sprintf("%s, which %s (%v)", t.name, t.use, err))
		fixes = append(fixes, hosttool.Install(t.name))
	}
	c.Detail = map[string]any{"found": found}
	if len(missing) == 0 {
		names := make([]string, 0, len(hostTools))
		for _, t := range hostTools {
			names = append(names, fmt.Sprintf("%s (%s)", t.name, found[t.name]))
		}
		c.Why = "found " + strings.Join(names, ", ")
		return c
	}
	c.Why = "missing: " + strings.Join(missing, "; ")
	c.Fix = strings.Join(fixes, "; ")
	return c
}
