package qemu

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"isopod/internal/vmm"
)

// kvmNode is a /dev/kvm with mode perm, owned by root and group gid.
func kvmNode(perm fs.FileMode, group string, gid int) *devNode {
	return &devNode{Path: "/dev/kvm", Mode: fs.ModeDevice | fs.ModeCharDevice | perm, Owner: "root", Group: group, GID: gid}
}

// TestKVMReason: the reason KVM is not used names the real cause, from
// stand-in host facts: no hardware virtualization, no /dev/kvm, or the
// device's mode and owners against who the VMM runs as, and which group
// would be needed.
func TestKVMReason(t *testing.T) {
	denied := &fs.PathError{Op: "open", Path: "/dev/kvm", Err: fs.ErrPermission}
	tests := []struct {
		name  string
		facts kvmFacts
		boot  error // the probe guest's outcome, when it runs
		accel vmm.Accel
		want  []string // in the reason
		not   []string
	}{
		{
			name:  "no virtualization, no device",
			facts: kvmFacts{},
			accel: vmm.AccelTCG,
			want:  []string{"no /dev/kvm", "neither vmx nor svm"},
			not:   []string{"group", "jail"},
		},
		{
			name:  "virtualization but no device",
			facts: kvmFacts{CPUFlag: "vmx"},
			accel: vmm.AccelTCG,
			want:  []string{"no /dev/kvm although the CPU has vmx", "kvm_intel"},
		},
		{
			name:  "amd without its module",
			facts: kvmFacts{CPUFlag: "svm"},
			accel: vmm.AccelTCG,
			want:  []string{"kvm_amd"},
		},
		{
			name:  "no virtualization, a root-only device the jailed VMM cannot open",
			facts: kvmFacts{Dev: kvmNode(0o600, "root", 0), VMM: &vmmCreds{UID: 998, GID: 998}},
			accel: vmm.AccelTCG,
			want: []string{"neither vmx nor svm", "/dev/kvm (crw------- root:root)", "uid 998, gid 998 with no supplementary group",
				"only its owner root may open it", "group kvm and mode 0660"},
			not: []string{"needs the kvm group"},
		},
		{
			name:  "a group device the jailed VMM is not in",
			facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o660, "kvm", 993), VMM: &vmmCreds{UID: 100000, GID: 100000}},
			accel: vmm.AccelTCG,
			want:  []string{"crw-rw---- root:kvm", "would need the group kvm", "subordinate id"},
			not:   []string{"vmx nor svm"},
		},
		{
			name:  "a device of another group than kvm",
			facts: kvmFacts{CPUFlag: "svm", Dev: kvmNode(0o660, "virt", 120), VMM: &vmmCreds{UID: 998, GID: 998, Groups: []int{993}}},
			accel: vmm.AccelTCG,
			want:  []string{"root:virt", "would need the group virt", "keeps only the group kvm"},
		},
		{
			name:  "isopod's own user not in the group",
			facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o660, "kvm", 993), Open: denied},
			accel: vmm.AccelTCG,
			want:  []string{"does not open for isopod's uid", "permission denied", "needs its group kvm", "usermod -aG kvm"},
		},
		{
			name:  "the jailed VMM has the group",
			facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o660, "kvm", 993), VMM: &vmmCreds{UID: 998, GID: 998, Groups: []int{993}}},
			accel: vmm.AccelKVM,
			want:  []string{"probe guest booted"},
		},
		{
			name:  "a device that opens on a CPU without the flags: the probe decides",
			facts: kvmFacts{Dev: kvmNode(0o666, "kvm", 993)},
			boot:  errors.New("qemu exited before the kernel banner"),
			accel: vmm.AccelTCG,
			want:  []string{"could not run a probe guest under KVM (qemu exited before the kernel banner)", "neither vmx nor svm"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := selectAccel(context.Background(), vmm.AccelAuto, accelProbes{
				env:     func() string { return "" },
				facts:   func() kvmFacts { return tt.facts },
				bootKVM: func(context.Context) error { return tt.boot },
			})
			if err != nil || c.Accel != tt.accel {
				t.Fatalf("got %+v, %v; want %s", c, err, tt.accel)
			}
			assertSentence(t, c.Reason)
			for _, w := range tt.want {
				if !strings.Contains(c.Reason, w) {
					t.Errorf("reason %q lacks %q", c.Reason, w)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(c.Reason, w) {
					t.Errorf("reason %q has %q", c.Reason, w)
				}
			}
		})
	}
}

// TestKVMForcedReason: a forced KVM that cannot be used fails with the
// real cause.
func TestKVMForcedReason(t *testing.T) {
	_, err := selectAccel(context.Background(), vmm.AccelAuto, accelProbes{
		env:     func() string { return "kvm" },
		facts:   func() kvmFacts { return kvmFacts{Dev: kvmNode(0o600, "root", 0), VMM: &vmmCreds{UID: 998, GID: 998}} },
		bootKVM: func(context.Context) error { return nil },
	})
	if err == nil || !strings.Contains(err.Error(), "ISOPOD_ACCEL=kvm forces kvm") || !strings.Contains(err.Error(), "neither vmx nor svm") {
		t.Errorf("got %v", err)
	}
}

func TestSnapshotReason(t *testing.T) {
	for _, a := range []vmm.Accel{vmm.AccelTCG, vmm.AccelKVM} {
		r := snapshotReason(a)
		assertSentence(t, r)
		if !strings.Contains(r, "esumed from a snapshot made under "+strings.ToUpper(string(a))+":") {
			t.Errorf("snapshot reason %q", r)
		}
	}
}

func TestCPUVirtFlag(t *testing.T) {
	tests := []struct{ in, want string }{
		{"processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n", ""},
		{"flags\t\t: fpu vmx sse2\n", "vmx"},
		{"flags\t\t: fpu svm sse2\nflags : vmx\n", "svm"},
		{"processor : 0\n", ""},
	}
	for _, tt := range tests {
		if got := cpuVirtFlag([]byte(tt.in)); got != tt.want {
			t.Errorf("cpuVirtFlag(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestDevAllows(t *testing.T) {
	tests := []struct {
		perm     fs.FileMode
		uid, gid int
		groups   []int
		want     bool
	}{
		{0o660, 998, 998, []int{993}, true},
		{0o660, 998, 998, nil, false},
		{0o660, 5, 993, nil, true},
		{0o600, 998, 998, []int{0}, false},
		{0o600, 0, 0, nil, true},
		{0o666, 998, 998, nil, true},
	}
	for _, tt := range tests {
		if got := kvmNode(tt.perm, "kvm", 993).allows(tt.uid, tt.gid, tt.groups); got != tt.want {
			t.Errorf("%o for uid %d gid %d groups %v: %v; want %v", tt.perm, tt.uid, tt.gid, tt.groups, got, tt.want)
		}
	}
}

func TestKVMFix(t *testing.T) {
	tests := []struct {
		facts kvmFacts
		want  string
	}{
		{kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o660, "kvm", 993)}, ""},
		{kvmFacts{}, "VT-x or AMD-V"},
		{kvmFacts{Dev: kvmNode(0o600, "root", 0), VMM: &vmmCreds{UID: 998, GID: 998}}, "VT-x or AMD-V"},
		{kvmFacts{CPUFlag: "svm"}, "modprobe"},
		{kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o600, "root", 0), VMM: &vmmCreds{UID: 998, GID: 998}}, "group kvm, mode 0660"},
	}
	for _, tt := range tests {
		if got := tt.facts.fix(); tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("fix for %+v = %q; want %q", tt.facts, got, tt.want)
		}
	}
}
