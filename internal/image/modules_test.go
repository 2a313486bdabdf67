package image

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClosure(t *testing.T) {
	index := map[string]modInfo{
		"a": {Name: "a", Path: "k/a.ko", Depends: []string{"c", "b"}},
		"b": {Name: "b", Path: "k/b.ko", Depends: []string{"c"}},
		"c": {Name: "c", Path: "k/c.ko"},
		"d": {Name: "d", Path: "k/d.ko", Depends: []string{"builtin_one"}},
		"x": {Name: "x", Path: "k/x.ko", Depends: []string{"y"}},
		"y": {Name: "y", Path: "k/y.ko", Depends: []string{"x"}},
		"z": {Name: "z", Path: "k/z.ko", Depends: []string{"ghost"}},
	}
	builtin := map[string]bool{"builtin_one": true, "overlay": true}
	tests := []struct {
		want    []string
		order   string
		errPart string
	}{
		{[]string{"a"}, "c,b,a", ""},
		{[]string{"b", "a"}, "c,b,a", ""},
		{[]string{"d", "overlay", "c"}, "d,c", ""},
		{[]string{"x"}, "", "cycle"},
		{[]string{"z"}, "", "ghost (needed by z)"},
		{[]string{"nope"}, "", "nope is neither"},
	}
	for _, tt := range tests {
		got, err := closure(tt.want, index, builtin)
		if tt.errPart != "" {
			if err == nil || !strings.Contains(err.Error(), tt.errPart) {
				t.Errorf("%v: err %v; want %q", tt.want, err, tt.errPart)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.want, err)
			continue
		}
		var names []string
		for _, m := range got {
			names = append(names, m.Name)
		}
		if strings.Join(names, ",") != tt.order {
			t.Errorf("%v: order %v; want %s", tt.want, names, tt.order)
		}
	}
}

// TestModInfoRealModules reads .modinfo from the unpacked pinned kernel.
func TestModInfoRealModules(t *testing.T) {
	root := "/tmp/k/x/lib/modules/6.1.0-50-cloud-amd64"
	if _, err := os.Stat(root); err != nil {
		t.Skipf("unpacked kernel modules not at %s", root)
	}
	index := map[string]modInfo{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, ".ko") {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		mi, err := readModInfoFile(p, rel)
		if err != nil {
			return err
		}
		index[mi.Name] = mi
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := index["virtio_net"].Depends; strings.Join(got, ",") != "virtio_ring,virtio,net_failover" {
		t.Errorf("virtio_net depends %v", got)
	}
	order, err := closure(GuestModules, index, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range order {
		for _, d := range m.Depends {
			if !seen[d] {
				t.Errorf("%s loads before its dependency %s", m.Name, d)
			}
		}
		seen[m.Name] = true
	}
	if !seen["failover"] || !seen["net_failover"] || seen["virtio_pci"] {
		t.Errorf("closure misses indirect dependencies: %v", order)
	}
}
