package agent

import (
	"os"
	"path/filepath"
)

// Reading a stage's own tree into the guest's caches before an assembled
// snapshot is taken (agentproto.Mount.Prefetch): a clone's commands then
// find the stage's directories and inodes, through the root's overlay and
// in the layers' filesystems, already in its RAM instead of reading them
// from its disks, which under TCG costs a fresh VMM tens of milliseconds
// for a few hundred files.

// prefetchTree looks up, breadth first, every path of the trees in layers
// (the stage layers' directories, as overlayfs stacks them) through root
// (the overlay over them), until max entries were looked up. Only
// metadata is read: directories are listed and entries looked up with
// lstat, no file's data. It returns how many entries were looked up.
// Errors end a directory's listing, never the walk: a prefetch is a
// cache's warm-up, never needed for the run.
func prefetchTree(layers []string, root string, max int) int {
	n := 0
	seen := map[string]bool{".": true}
	queue := []string{"."}
	for len(queue) > 0 && n < max {
		dir := queue[0]
		queue = queue[1:]
		for _, layer := range layers {
			entries, err := os.ReadDir(filepath.Join(layer, dir))
			if err != nil {
				continue
			}
			for _, e := range entries {
				if n >= max {
					return n
				}
				rel := filepath.Join(dir, e.Name())
				if seen[rel] {
					continue
				}
				seen[rel] = true
				n++
				fi, err := os.Lstat(filepath.Join(root, rel))
				if err == nil && fi.IsDir() && e.IsDir() {
					queue = append(queue, rel)
				}
			}
		}
	}
	return n
}
