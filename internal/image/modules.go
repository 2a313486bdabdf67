package image

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// modInfo is what the closure needs to know about one module.
type modInfo struct {
	Name    string   // module name, '-' folded to '_'
	Path    string   // relative to /lib/modules/<release>, e.g. kernel/fs/overlayfs/overlay.ko
	Depends []string // module names
}

// modName folds a module file or dependency name to the kernel's spelling:
// "kernel/fs/fat/vfat.ko.xz" and "vfat" are both "vfat".
func modName(s string) string {
	s = path.Base(s)
	s = strings.TrimSuffix(s, ".xz")
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// readModInfo reads the .modinfo section of a .ko.
func readModInfo(r io.ReaderAt, relPath string) (modInfo, error) {
	ef, err := elf.NewFile(r)
	if err != nil {
		return modInfo{}, fmt.Errorf("module %s: %w", relPath, err)
	}
	defer ef.Close()
	mi := modInfo{Name: modName(relPath), Path: relPath}
	sec := ef.Section(".modinfo")
	if sec == nil {
		return mi, nil
	}
	data, err := sec.Data()
	if err != nil {
		return modInfo{}, fmt.Errorf("module %s: reading .modinfo: %w", relPath, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			if v != "" {
				mi.Name = modName(v)
			}
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.Depends = append(mi.Depends, modName(d))
				}
			}
		}
	}
	return mi, nil
}

// readModInfoFile reads the .modinfo of the .ko file at file.
func readModInfoFile(file, relPath string) (modInfo, error) {
	f, err := os.Open(file)
	if err != nil {
		return modInfo{}, err
	}
	defer f.Close()
	return readModInfo(f, relPath)
}

// parseModulesDep reads depmod's modules.dep ("path: dep dep ...").
func parseModulesDep(r io.Reader) (map[string]modInfo, error) {
	mods := map[string]modInfo{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		mi := modInfo{Name: modName(p), Path: p}
		for _, d := range strings.Fields(deps) {
			mi.Depends = append(mi.Depends, modName(d))
		}
		mods[mi.Name] = mi
	}
	return mods, sc.Err()
}

// parseBuiltin reads modules.builtin (one kernel/.../name.ko a line) into
// a set of module names.
func parseBuiltin(r io.Reader) (map[string]bool, error) {
	set := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			set[modName(l)] = true
		}
	}
	return set, sc.Err()
}

// closure returns the modules to load for want, dependencies first. Wanted
// or depended-on names that are built in are skipped; any other unknown
// name is an error. The order is deterministic: want in its order, each
// module's dependencies in sorted order before it.
func closure(want []string, mods map[string]modInfo, builtin map[string]bool) ([]modInfo, error) {
	var order []modInfo
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = modName(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle through %s", name)
		case 2:
			return nil
		}
		mi, ok := mods[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) is neither in the package nor built in", name, from)
			}
			return fmt.Errorf("module %s is neither in the package nor built in", name)
		}
		state[name] = 1
		deps := append([]string(nil), mi.Depends...)
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, mi)
		return nil
	}
	for _, w := range want {
		if err := visit(w, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}
