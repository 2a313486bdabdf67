package machine

import (
	"slices"
	"strings"
	"testing"

	"isopod/internal/vmm"
)

// TestSpecColdConfig: a cold boot's VMM gets the Spec's kernel, sizes,
// the disks in use and the hostname on its command line; every command's
// environment starts from the Spec's.
func TestSpecColdConfig(t *testing.T) {
	sp := Spec{ID: "vm-0000000c", Dir: "/vms/vm-0000000c", Kernel: "/k/vmlinuz", Initrd: "/k/initrd", VCPUs: 2, MemMiB: 512,
		Disks: Disks{Base: "/img/base.sqfs", Scratch: "/vm/scratch.ext4"}, Hostname: "calm-crab", Env: []string{"PATH=/bin", "HOME=/root"}}
	net := &vmm.Net{Socket: "/run/net.sock"}
	cfg := sp.ColdConfig(net)
	if cfg.ID != sp.ID || cfg.Dir != sp.Dir || cfg.Kernel != sp.Kernel || cfg.Initrd != sp.Initrd || cfg.VCPUs != 2 || cfg.MemMiB != 512 || cfg.Net != net {
		t.Errorf("config %+v", cfg)
	}
	if len(cfg.Disks) != 2 || cfg.Disks[0].Path != "/img/base.sqfs" || cfg.Disks[1].Path != "/vm/scratch.ext4" {
		t.Errorf("disks %+v; want the base and the scratch only", cfg.Disks)
	}
	if !strings.Contains(cfg.Cmdline, "isopod.hostname=calm-crab") {
		t.Errorf("cmdline %q lacks the hostname", cfg.Cmdline)
	}
	env := sp.ExecEnv([]string{"HOME=/tmp"})
	if want := []string{"PATH=/bin", "HOME=/root", "HOME=/tmp"}; !slices.Equal(env, want) {
		t.Errorf("exec env %v; want %v", env, want)
	}
	if sp.ExecEnv(nil); len(sp.Env) != 2 {
		t.Errorf("ExecEnv changed the Spec's Env: %v", sp.Env)
	}
}
