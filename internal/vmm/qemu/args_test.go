package qemu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// qbootOptions are the machine options under qboot (Debian 12's QEMU 7.2).
const qbootOptions = "microvm,acpi=on,x-option-roms=off,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off"

func baseConfig() vmm.Config {
	return vmm.Config{
		ID:      "abc123",
		Dir:     "/var/vm/abc123",
		Kernel:  "/k/vmlinuz",
		Initrd:  "/k/initrd.cpio",
		Cmdline: "quiet isopod.hostname=box",
		VCPUs:   2,
		MemMiB:  512,
	}
}

func TestBuildArgsGolden(t *testing.T) {
	cfg := baseConfig()
	cfg.Disks = []vmm.Disk{
		{Path: "/img/base.sqfs", ReadOnly: true, Serial: "isopod-base"},
		{Path: "/vm/scr,atch.ext4", Serial: "isopod-scratch"},
	}
	cfg.Net = &vmm.Net{Socket: "/vm/net.sock", MAC: "52:54:00:aa:bb:cc"}
	got := buildArgs(&cfg, launch{
		machine: qbootOptions,
		accel:   vmm.AccelTCG, tscKHz: 2100000, memPath: "/proc/self/fd/5",
		kernelPath: "/proc/self/fd/6", initrdPath: "/proc/self/fd/7",
		diskFDs: [][]int{{8}, {9, 10}}, netFD: 11, sandbox: true,
	})
	want := []string{
		"-name", "isopod-abc123",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-machine", "microvm,acpi=on,x-option-roms=off,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off",
		"-accel", "tcg",
		"-cpu", "max,erms=off,fsrm=off",
		"-smp", "2",
		"-m", "512M",
		"-object", "memory-backend-file,id=mem0,size=512M,mem-path=/proc/self/fd/5,share=on",
		"-machine", "memory-backend=mem0",
		"-kernel", "/proc/self/fd/6",
		"-append", "console=ttyS0 tsc_early_khz=2100000 tsc=reliable quiet isopod.hostname=box",
		"-initrd", "/proc/self/fd/7",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-chardev", "stdio,id=con0,signal=off",
		"-serial", "chardev:con0",
		"-chardev", "socket,id=qmp0,fd=4",
		"-mon", "chardev=qmp0,mode=control",
		"-global", "virtio-mmio.force-legacy=false",
		"-device", "virtio-serial-device,id=vser0,max_ports=2",
		"-chardev", "socket,id=agent0,fd=3",
		"-device", "virtserialport,chardev=agent0,name=isopod.agent",
		"-device", "vmgenid,id=vmgenid0,guid=auto",
		"-add-fd", "fd=8,set=1",
		"-drive", "if=none,id=disk0,file=/dev/fdset/1,format=raw,readonly=on,cache=unsafe,aio=threads",
		"-device", "virtio-blk-device,drive=disk0,serial=isopod-base",
		"-add-fd", "fd=9,set=2", "-add-fd", "fd=10,set=2",
		"-drive", "if=none,id=disk1,file=/dev/fdset/2,format=raw,readonly=off,cache=unsafe,aio=threads,discard=unmap,file.locking=off",
		"-device", "virtio-blk-device,drive=disk1,serial=isopod-scratch",
		"-netdev", "stream,id=net0,server=off,addr.type=fd,addr.str=11",
		"-device", "virtio-net-device,netdev=net0,guest_announce=off,mac=52:54:00:aa:bb:cc",
	}
	if !slices.Equal(got, want) {
		t.Errorf("argv mismatch\ngot:  %q\nwant: %q", got, want)
	}
}

func TestBuildArgsVariants(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*vmm.Config)
		l       launch
		has     [][]string // consecutive argv pairs that must appear
		hasNot  []string   // argv entries that must not appear
		cmdline string
	}{
		{
			name:    "kvm uses the host cpu and no tsc args",
			l:       launch{accel: vmm.AccelKVM, tscKHz: 2100000},
			has:     [][]string{{"-accel", "kvm"}, {"-cpu", "host"}},
			cmdline: "console=ttyS0 quiet isopod.hostname=box",
		},
		{
			name:    "tcg without a known tsc frequency",
			l:       launch{accel: vmm.AccelTCG},
			has:     [][]string{{"-accel", "tcg"}, {"-cpu", "max,erms=off,fsrm=off"}},
			cmdline: "console=ttyS0 quiet isopod.hostname=box",
		},
		{
			name: "the machine plan's options and data directories",
			l: launch{accel: vmm.AccelTCG, machine: "microvm,acpi=on,pit=off",
				dataDirs: []string{"/opt/q/usr/share/qemu", "/opt/q/usr/share/seabios"}},
			has: [][]string{{"-L", "/opt/q/usr/share/qemu"}, {"-L", "/opt/q/usr/share/seabios"}, {"-machine", "microvm,acpi=on,pit=off"}},
		},
		{
			name:   "no data directories unless the plan has them",
			l:      launch{accel: vmm.AccelTCG, machine: qbootOptions},
			hasNot: []string{"-L"},
		},
		{
			name:   "unjailed machines have no seccomp filter of QEMU's",
			l:      launch{accel: vmm.AccelTCG},
			hasNot: []string{"-sandbox"},
		},
		{
			name:   "no NIC and no disks",
			l:      launch{accel: vmm.AccelTCG},
			hasNot: []string{"-netdev", "-drive", "virtio-net-device"},
		},
		{
			name:    "caller's console is kept",
			mutate:  func(c *vmm.Config) { c.Cmdline = "console=hvc0" },
			l:       launch{accel: vmm.AccelKVM},
			cmdline: "console=hvc0",
		},
		{
			name:   "no initrd",
			mutate: func(c *vmm.Config) { c.Initrd = "" },
			l:      launch{accel: vmm.AccelKVM},
			hasNot: []string{"-initrd"},
		},
		{
			name: "restore maps memory privately and takes incoming state",
			l:    launch{accel: vmm.AccelTCG, memPath: "/snap/m,em", restored: true, incoming: "defer"},
			has: [][]string{
				{"-object", "memory-backend-file,id=mem0,size=512M,mem-path=/snap/m,,em,share=off"},
				{"-incoming", "defer"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			got := buildArgs(&cfg, tt.l)
			for _, pair := range tt.has {
				if !containsPair(got, pair[0], pair[1]) {
					t.Errorf("argv lacks %q %q: %q", pair[0], pair[1], got)
				}
			}
			for _, bad := range tt.hasNot {
				for _, a := range got {
					if strings.Contains(a, bad) {
						t.Errorf("argv has %q: %q", bad, got)
					}
				}
			}
			if tt.cmdline != "" && !containsPair(got, "-append", tt.cmdline) {
				t.Errorf("argv lacks -append %q: %q", tt.cmdline, got)
			}
		})
	}
}

func containsPair(argv []string, k, v string) bool {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == k && argv[i+1] == v {
			return true
		}
	}
	return false
}

func TestKernelCmdline(t *testing.T) {
	tests := []struct {
		user  string
		accel vmm.Accel
		khz   uint64
		want  string
	}{
		{"", vmm.AccelKVM, 0, "console=ttyS0"},
		{"", vmm.AccelTCG, 1000, "console=ttyS0 tsc_early_khz=1000 tsc=reliable"},
		{"tsc=unstable", vmm.AccelTCG, 1000, "console=ttyS0 tsc_early_khz=1000 tsc=unstable"},
		{"console=ttyS0,115200 quiet", vmm.AccelKVM, 0, "console=ttyS0,115200 quiet"},
		// After "--" everything belongs to init, not the kernel.
		{"-- console=x", vmm.AccelKVM, 0, "console=ttyS0 -- console=x"},
	}
	for _, tt := range tests {
		if got := kernelCmdline(tt.user, tt.accel, tt.khz); got != tt.want {
			t.Errorf("kernelCmdline(%q, %s, %d) = %q; want %q", tt.user, tt.accel, tt.khz, got, tt.want)
		}
	}
}

func TestCheckConfig(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*vmm.Config)
		want   error
	}{
		{"valid", func(*vmm.Config) {}, nil},
		{"no id", func(c *vmm.Config) { c.ID = "" }, errdefs.ErrInvalidArgument},
		{"id with comma", func(c *vmm.Config) { c.ID = "a,b" }, errdefs.ErrInvalidArgument},
		{"serial with comma", func(c *vmm.Config) {
			c.Disks = []vmm.Disk{{Path: "/d", Serial: "a,b"}}
		}, errdefs.ErrInvalidArgument},
		{"tap NIC", func(c *vmm.Config) {
			c.Net = &vmm.Net{Tap: "tap0", MAC: "52:54:00:00:00:01"}
		}, errdefs.ErrNotSupported},
		{"bad MAC", func(c *vmm.Config) {
			c.Net = &vmm.Net{Socket: "/s", MAC: "52:54:00"}
		}, errdefs.ErrInvalidArgument},
		{"good NIC", func(c *vmm.Config) {
			c.Net = &vmm.Net{Socket: "/s", MAC: "52:54:00:00:00:01"}
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			tt.mutate(&cfg)
			err := checkConfig(&cfg)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("checkConfig: %v; want %v", err, tt.want)
			}
		})
	}
}
