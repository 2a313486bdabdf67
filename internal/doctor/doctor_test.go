package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/jail"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// healthy is a host on which every check passes.
func healthy() Host {
	return Host{
		LookPath: func(name string) (string, error) { return "/usr/bin/" + name, nil },
		QEMUVersion: func(context.Context, string) (string, error) {
			return "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)\nCopyright (c) 2003-2022 Fabrice Bellard\n", nil
		},
		VMM: fakeVMM(vmmfake.Config{
			Machine: vmm.MachineInfo{Options: "microvm,acpi=on,x-option-roms=off", Firmware: "/usr/share/qemu/qboot.rom", FirmwareKind: "qboot",
				Why: "The microvm firmware is qboot (/usr/share/qemu/qboot.rom), which loads the kernel itself, so option ROMs are off."},
			AccelVerdict: vmm.AccelVerdict{Probe: &vmm.AccelProbe{OK: true, At: time.Unix(1e9, 0)}},
		}),
		OpenKVM: func() error { return nil },
		Jail:    func(context.Context, string) (JailInfo, error) { return JailInfo{UID: 998, GID: 998, Tried: true}, nil },
		Kernel: func() (image.BootKernel, error) {
			return image.BootKernel{Path: "/h/kernels/6.1/vmlinuz", Info: image.KernelInfo{Package: "linux-image-cloud", Version: "6.1", Pinned: true}}, nil
		},
		Images: func() ([]image.ImageInfo, error) {
			return []image.ImageInfo{
				{Flavor: image.FlavorInitramfs, Built: true, Path: "/h/images/initramfs.cpio"},
				{Flavor: image.FlavorBaseMin, Built: true, Path: "/h/images/base-min.sqfs"},
				{Flavor: image.FlavorBaseDebian, Built: true, Path: "/h/images/base-debian.sqfs"},
			}, nil
		},
		Agent:     func() (string, error) { return "/usr/lib/isopod/isopod-agent", nil },
		FreeBytes: func(dir string) (uint64, string, error) { return 50 << 30, dir, nil },
		WarmPool:  func(context.Context) (WarmPool, error) { return WarmPool{}, nil },
	}
}

// fakeVMM is the core's VMM driver as the fake one configured by cfg.
func fakeVMM(cfg vmmfake.Config) func(context.Context) (vmm.Prober, error) {
	return func(context.Context) (vmm.Prober, error) { return vmmfake.New(cfg) }
}

func check(t *testing.T, r *Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return Check{}
}

func TestHealthy(t *testing.T) {
	r := Run(t.Context(), Config{Version: "0.1.0", Home: "/h"}, healthy())
	if !r.OK || r.Error != "" || r.Class != "" || r.Accel != "kvm" {
		t.Fatalf("ok %v, error %q, class %q, accel %q; want ok, no error, kvm", r.OK, r.Error, r.Class, r.Accel)
	}
	seen := map[string]bool{}
	for _, c := range r.Checks {
		if seen[c.Name] {
			t.Errorf("check %q twice", c.Name)
		}
		seen[c.Name] = true
		if !c.OK || c.Fix != "" || c.Why == "" {
			t.Errorf("%s: ok %v, fix %q, why %q; want ok, no fix, a why", c.Name, c.OK, c.Fix, c.Why)
		}
	}
	required := map[string]bool{"qemu": true, "jail": true, "tools": true, "kernel": true, "initramfs": true, "base": true, "disk": true}
	for _, name := range []string{"qemu", "kvm", "jail", "tools", "kernel", "agent", "initramfs", "base", "base-min", "base-debian", "disk", "warm_pool"} {
		if c := check(t, r, name); c.Required != required[name] {
			t.Errorf("%s: required %v; want %v", name, c.Required, required[name])
		}
	}
	if v := check(t, r, "qemu").Detail["version"]; v != "7.2.19" {
		t.Errorf("qemu version %v; want 7.2.19", v)
	}
}

// TestQEMUMachine: the qemu check says which QEMU, which firmware, which
// machine options and why.
func TestQEMUMachine(t *testing.T) {
	h := healthy()
	h.QEMUVersion = func(context.Context, string) (string, error) {
		return "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)\n", nil
	}
	h.VMM = fakeVMM(vmmfake.Config{Machine: vmm.MachineInfo{Options: "microvm,acpi=on,pit=off", Firmware: "/usr/share/seabios/bios-microvm.bin", FirmwareKind: "SeaBIOS",
		DataDirs: []string{"/opt/q/share/qemu"},
		Why:      "The microvm firmware is SeaBIOS (/usr/share/seabios/bios-microvm.bin), which loads the kernel through an option ROM, so option ROMs stay on."}})
	c := check(t, Run(t.Context(), Config{Home: "/h"}, h), "qemu")
	for _, w := range []string{"QEMU 10.0.2 at /usr/bin/qemu-system-x86_64", "-machine microvm,acpi=on,pit=off", "SeaBIOS", "option ROMs stay on"} {
		if !strings.Contains(c.Why, w) {
			t.Errorf("why %q lacks %q", c.Why, w)
		}
	}
	if !c.OK || c.Detail["firmware_kind"] != "SeaBIOS" || c.Detail["machine_options"] != "microvm,acpi=on,pit=off" || c.Detail["data_dirs"] == nil {
		t.Errorf("check %+v", c)
	}
}

func TestFailures(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cfg   func(*Config)
		host  func(*Host)
		check string
		// required: the report fails too.
		required bool
		why, fix []string // each must appear
		accel    string   // "" : not checked
	}{
		{name: "no qemu", host: func(h *Host) {
			h.LookPath = func(string) (string, error) { return "", errors.New("not in PATH") }
		}, check: "qemu", required: true, why: []string{"not found", "qemu-system-x86_64"}, fix: []string{"qemu-system-x86", "ISOPOD_QEMU"}},
		{name: "ISOPOD_QEMU is looked up", cfg: func(c *Config) { c.QEMU = "/opt/q" }, host: func(h *Host) {
			h.LookPath = func(p string) (string, error) { return "", fmt.Errorf("%s: no such file", p) }
		}, check: "qemu", required: true, why: []string{"ISOPOD_QEMU=/opt/q", "/opt/q: no such file"}},
		{name: "old qemu", host: func(h *Host) {
			h.QEMUVersion = func(context.Context, string) (string, error) { return "QEMU emulator version 6.2.0\n", nil }
		}, check: "qemu", required: true, why: []string{"6.2.0", "older than 7.2"}, fix: []string{"7.2 or newer"}},
		{name: "qemu with no version", host: func(h *Host) {
			h.QEMUVersion = func(context.Context, string) (string, error) { return "something else\n", nil }
		}, check: "qemu", required: true, why: []string{"no version", "something else"}},
		{name: "a QEMU that cannot start isopod's machine", host: func(h *Host) {
			h.VMM = fakeVMM(vmmfake.Config{MachineError: errors.New("finds no bios-microvm.bin, the microvm firmware")})
		}, check: "qemu", required: true, why: []string{"7.2.19", "cannot start isopod's machine", "bios-microvm.bin"}, fix: []string{"seabios"}},
		{name: "kvm ruled out by the host's facts", host: func(h *Host) {
			h.VMM = fakeVMM(vmmfake.Config{AccelVerdict: vmm.AccelVerdict{
				Obstacle: "The CPU offers no hardware virtualization (/proc/cpuinfo lists neither vmx nor svm).",
				Fix:      "Use a host whose CPU offers VT-x or AMD-V.",
			}})
		}, check: "kvm", why: []string{"KVM cannot be used", "neither vmx nor svm", "TCG"}, fix: []string{"VT-x or AMD-V"}, accel: "tcg"},
		{name: "no /dev/kvm", host: func(h *Host) {
			h.OpenKVM = func() error { return &fs.PathError{Op: "open", Path: "/dev/kvm", Err: fs.ErrNotExist} }
		}, check: "kvm", why: []string{"not usable", "TCG", "slower"}, fix: []string{"virtualization"}, accel: "tcg"},
		{name: "/dev/kvm not permitted", host: func(h *Host) {
			h.OpenKVM = func() error { return &fs.PathError{Op: "open", Path: "/dev/kvm", Err: fs.ErrPermission} }
		}, check: "kvm", why: []string{"TCG"}, fix: []string{"kvm group"}, accel: "tcg"},
		{name: "kvm opens but cannot run a guest", host: func(h *Host) {
			h.VMM = fakeVMM(vmmfake.Config{AccelVerdict: vmm.AccelVerdict{
				Probe: &vmm.AccelProbe{Reason: "Failed to set MSR 0x10a.", At: time.Unix(1e9, 0)},
			}})
		}, check: "kvm", why: []string{"could not run a guest", "Failed to set MSR 0x10a.", "TCG"}, accel: "tcg"},
		{name: "kvm opens and was never probed", host: func(h *Host) {
			h.VMM = fakeVMM(vmmfake.Config{})
		}, check: "kvm", why: []string{"the first run probes"}, accel: "kvm"},
		{name: "tcg forced", cfg: func(c *Config) { c.Accel = "tcg" }, check: "kvm", why: []string{"ISOPOD_ACCEL=tcg", "slower"}, fix: []string{"unset ISOPOD_ACCEL"}, accel: "tcg"},
		{name: "no jail", host: func(h *Host) {
			h.Jail = func(context.Context, string) (JailInfo, error) {
				return JailInfo{}, fmt.Errorf("wrapped: %w", &jail.SetupError{What: "user namespaces are disabled", Fix: "sysctl -w user.max_user_namespaces=15000"})
			}
		}, check: "jail", required: true, why: []string{"user namespaces are disabled"}, fix: []string{"max_user_namespaces"}},
		{name: "qemu does not start in the jail", host: func(h *Host) {
			h.Jail = func(context.Context, string) (JailInfo, error) {
				return JailInfo{}, errors.New("starting qemu in the jail: mounting the jail's /proc: operation not permitted")
			}
		}, check: "jail", required: true, why: []string{"mounting the jail's /proc"}, fix: []string{"ISOPOD_JAIL=off"}},
		{name: "no kernel", host: func(h *Host) {
			h.Kernel = func() (image.BootKernel, error) {
				return image.BootKernel{}, fmt.Errorf("no guest kernel: %w", errdefs.ErrFailedPrecondition)
			}
		}, check: "kernel", required: true, why: []string{"no guest kernel"}, fix: []string{"isopod image fetch-kernel"}},
		{name: "an unpinned kernel passes with a warning", host: func(h *Host) {
			h.Kernel = func() (image.BootKernel, error) {
				return image.BootKernel{Path: "/k", Info: image.KernelInfo{Package: "linux-image-x", Version: "6.9"}}, nil
			}
		}, check: "kernel", why: []string{"not the pinned one"}, fix: []string{"fetch-kernel"}},
		{name: "stale initramfs", host: func(h *Host) {
			h.Images = func() ([]image.ImageInfo, error) {
				return []image.ImageInfo{
					{Flavor: image.FlavorInitramfs, Built: true, Stale: true, StaleReason: "protocol 2, isopod speaks 3"},
					{Flavor: image.FlavorBaseMin, Built: true},
				}, nil
			}
		}, check: "initramfs", required: true, why: []string{"stale", "protocol 2"}, fix: []string{"isopod image build initramfs"}},
		{name: "no agent", host: func(h *Host) {
			h.Agent = func() (string, error) { return "", errors.New("guest agent isopod-agent not found") }
		}, check: "agent", why: []string{"not found", "cannot be built"}, fix: []string{image.SystemAgentPath}},
		{name: "no base", host: func(h *Host) {
			h.Images = func() ([]image.ImageInfo, error) {
				return []image.ImageInfo{
					{Flavor: image.FlavorInitramfs, Built: true},
					{Flavor: image.FlavorBaseMin}, {Flavor: image.FlavorBaseDebian, Built: true, Stale: true, StaleReason: "old recipe"},
				}, nil
			}
		}, check: "base", required: true, why: []string{"no base image", "base-min, base-debian", "build-all"}, fix: []string{"isopod image build base-min"}},
		{name: "a custom kernel's fixes carry it", cfg: func(c *Config) { c.Kernel = "/k/bzImage" }, host: func(h *Host) {
			h.Images = func() ([]image.ImageInfo, error) {
				return []image.ImageInfo{{Flavor: image.FlavorInitramfs}, {Flavor: image.FlavorBaseMin, Built: true}}, nil
			}
		}, check: "initramfs", required: true, fix: []string{"isopod --kernel /k/bzImage image build initramfs"}},
		{name: "full disk", host: func(h *Host) {
			h.FreeBytes = func(string) (uint64, string, error) { return 100 << 20, "/h", nil }
		}, check: "disk", required: true, why: []string{"0.1 GiB free", "under the 2.0 GiB"}, fix: []string{"vm gc", "ISOPOD_HOME"}},
		{name: "stale snapshots", host: func(h *Host) {
			h.WarmPool = func(context.Context) (WarmPool, error) {
				return WarmPool{Snapshots: 2, Bytes: 1 << 30, Stale: map[string]string{"k1": "base build gone"}}, nil
			}
		}, check: "warm_pool", why: []string{"2 snapshot(s)", "k1: base build gone"}, fix: []string{"isopod vm gc"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, h := Config{Version: "0.1.0", Home: "/h"}, healthy()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			if tt.host != nil {
				tt.host(&h)
			}
			r := Run(t.Context(), cfg, h)
			c := check(t, r, tt.check)
			if c.OK && len(tt.fix) > 0 && tt.check != "kernel" {
				t.Errorf("%s passed; want it to fail", tt.check)
			}
			if r.OK == tt.required {
				t.Errorf("report ok %v; want %v (failed: %v)", r.OK, !tt.required, r.Failed())
			}
			if tt.required && (!strings.Contains(r.Error, tt.check) || r.Class != "failed_precondition") {
				t.Errorf("error %q, class %q; want it to name %s, failed_precondition", r.Error, r.Class, tt.check)
			}
			for _, w := range tt.why {
				if !strings.Contains(c.Why, w) {
					t.Errorf("why %q does not say %q", c.Why, w)
				}
			}
			for _, w := range tt.fix {
				if !strings.Contains(c.Fix, w) {
					t.Errorf("fix %q does not say %q", c.Fix, w)
				}
			}
			if tt.accel != "" && r.Accel != tt.accel {
				t.Errorf("accel %q; want %q", r.Accel, tt.accel)
			}
		})
	}
}

// TestFirstUse: with nothing built, each image check names the command
// that builds it, and the kernel comes first.
func TestFirstUse(t *testing.T) {
	h := healthy()
	h.Kernel = func() (image.BootKernel, error) {
		return image.BootKernel{}, errors.New("no guest kernel in /h/kernels")
	}
	h.Images = func() ([]image.ImageInfo, error) {
		return []image.ImageInfo{{Flavor: image.FlavorInitramfs}, {Flavor: image.FlavorBaseMin}, {Flavor: image.FlavorBaseDebian}}, nil
	}
	r := Run(t.Context(), Config{Home: "/h"}, h)
	want := map[string]string{
		"kernel":      "isopod image fetch-kernel",
		"initramfs":   "isopod image fetch-kernel, then isopod image build initramfs",
		"base":        "isopod image build base-min",
		"base-min":    "isopod image build base-min",
		"base-debian": "isopod image build base-debian",
	}
	for name, fix := range want {
		if c := check(t, r, name); c.OK || c.Fix != fix {
			t.Errorf("%s: ok %v, fix %q; want failed, %q", name, c.OK, c.Fix, fix)
		}
	}
	if got, want := r.Failed(), []string{"kernel", "initramfs", "base"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("failed %v; want %v", got, want)
	}
}

// TestNothingReadable: a host whose facts cannot be read fails every
// required check instead of passing it.
func TestNothingReadable(t *testing.T) {
	r := Run(t.Context(), Config{Home: "/h"}, Host{})
	if r.OK {
		t.Fatal("an empty host passed")
	}
	for _, c := range r.Checks {
		if c.Required && c.OK {
			t.Errorf("%s passed on a host with no facts", c.Name)
		}
	}
}

func TestJailOff(t *testing.T) {
	h := healthy()
	h.Jail = func(context.Context, string) (JailInfo, error) { return JailInfo{}, errors.New("must not be called") }
	r := Run(t.Context(), Config{Home: "/h", JailOff: true}, h)
	c := check(t, r, "jail")
	if !r.OK || !c.OK || !strings.Contains(c.Why, "unconfined") {
		t.Errorf("report ok %v, jail %+v; want both ok, saying unconfined", r.OK, c)
	}
}

func TestJSONShape(t *testing.T) {
	b, err := json.Marshal(Run(t.Context(), Config{Home: "/h"}, healthy()))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ok", "version", "home", "accel", "checks"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report lacks %q: %s", k, b)
		}
	}
	for _, k := range []string{"error", "class"} {
		if _, ok := m[k]; ok {
			t.Errorf("a passing report carries %q", k)
		}
	}
	c := m["checks"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "ok", "required", "why"} {
		if _, ok := c[k]; !ok {
			t.Errorf("a check lacks %q: %v", k, c)
		}
	}
}

// TestJailTriesTheRunsQEMU: the jail check starts the QEMU the qemu check
// found, and none when there is none.
func TestJailTriesTheRunsQEMU(t *testing.T) {
	for _, tt := range []struct {
		cfg   Config
		found bool
		want  string
	}{
		{Config{Home: "/h"}, true, "/usr/bin/qemu-system-x86_64"},
		{Config{Home: "/h", QEMU: "/opt/qemu/bin/qemu-system-x86_64"}, true, "/usr/bin//opt/qemu/bin/qemu-system-x86_64"},
		{Config{Home: "/h"}, false, ""},
	} {
		h := healthy()
		if !tt.found {
			h.LookPath = func(string) (string, error) { return "", errors.New("not found") }
		}
		got := "unset"
		h.Jail = func(_ context.Context, qemu string) (JailInfo, error) {
			got = qemu
			return JailInfo{UID: 1, Tried: qemu != ""}, nil
		}
		r := Run(t.Context(), tt.cfg, h)
		if got != tt.want {
			t.Errorf("QEMU %q, found %v: the jail tried %q; want %q", tt.cfg.QEMU, tt.found, got, tt.want)
		}
		if c := check(t, r, "jail"); c.OK != true || strings.Contains(c.Why, "QEMU starts in the jail") != tt.found {
			t.Errorf("jail check %+v; want ok, saying whether QEMU started in it", c)
		}
	}
}

// TestTools: the tools check finds the programs isopod starts; a missing
// mkfs.ext4 fails it (and the report), a missing optional one is named
// with its package without failing it.
func TestTools(t *testing.T) {
	missing := func(names ...string) func(string) (string, error) {
		return func(name string) (string, error) {
			for _, n := range names {
				if n == name {
					return "", fmt.Errorf("%s not found on PATH (/usr/bin:/bin) or in /usr/sbin", name)
				}
			}
			return "/usr/sbin/" + name, nil
		}
	}
	for _, tt := range []struct {
		name     string
		missing  []string
		ok       bool
		why, fix []string
	}{
		{"all found", nil, true, []string{"mkfs.ext4 (/usr/sbin/mkfs.ext4)", "debugfs (/usr/sbin/debugfs)"}, nil},
		{"no mkfs.ext4", []string{"mkfs.ext4"}, false,
			[]string{"missing: mkfs.ext4, which makes the scratch disk", "not found on PATH (/usr/bin:/bin) or in /usr/sbin"},
			[]string{"`apt-get install e2fsprogs`", "`dnf install e2fsprogs`"}},
		{"no debugfs nor git", []string{"debugfs", "git"}, true,
			[]string{"debugfs, which reads stage layers", "git, which lists"}, []string{"install e2fsprogs", "install git"}},
	} {
		h := healthy()
		h.LookPath = missing(tt.missing...)
		r := Run(t.Context(), Config{Home: "/h", QEMU: "/usr/bin/qemu-system-x86_64"}, h)
		c := check(t, r, "tools")
		if c.OK != tt.ok || !c.Required || r.OK != tt.ok || (c.Fix == "") != (len(tt.fix) == 0) {
			t.Errorf("%s: check %+v, report ok %v; want ok %v", tt.name, c, r.OK, tt.ok)
		}
		for _, s := range tt.why {
			if !strings.Contains(c.Why, s) {
				t.Errorf("%s: why %q lacks %q", tt.name, c.Why, s)
			}
		}
		for _, s := range tt.fix {
			if !strings.Contains(c.Fix, s) {
				t.Errorf("%s: fix %q lacks %q", tt.name, c.Fix, s)
			}
		}
	}
}

// TestJailHelper: the jail check names the helper that starts each VMM,
// and with none says that installing isopod-jail makes starts faster.
func TestJailHelper(t *testing.T) {
	for _, tt := range []struct {
		helper string
		passed []string
		want   string
	}{
		{"/usr/lib/isopod/isopod-jail", nil, "the jail helper /usr/lib/isopod/isopod-jail starts each VMM"},
		{"", nil, "installing isopod-jail there (scripts/install.sh and the packages do) makes each VMM start faster"},
		{"", []string{"/x/isopod-jail: writable by group or others (mode 0775)"},
			"the jail helper was passed over (/x/isopod-jail: writable by group or others (mode 0775)): make it a regular file owned by root or by you"},
	} {
		h := healthy()
		h.Jail = func(context.Context, string) (JailInfo, error) {
			return JailInfo{UID: 1, Tried: true, Helper: tt.helper, PassedOver: tt.passed}, nil
		}
		c := check(t, Run(t.Context(), Config{Home: "/h"}, h), "jail")
		if !c.OK || !strings.Contains(c.Why, tt.want) || c.Detail["helper"] != tt.helper {
			t.Errorf("helper %q: jail check %+v; want ok, saying %q, with the helper in its detail", tt.helper, c, tt.want)
		}
	}
}
