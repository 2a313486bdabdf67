package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// microvmHelp is `-machine microvm,help` as QEMU 7.2 and 10.0 print it
// (abridged).
const microvmHelp = `microvm-machine options:
  acpi=<OnOffAuto>       - Enable ACPI
  append=<string>        - Linux kernel command line
  auto-kernel-cmdline=<bool> - Set off to disable adding virtio-mmio devices to the kernel cmdline
  isa-serial=<bool>      - Set off to disable the instantiation an ISA serial port
  pic=<OnOffAuto>        - Enable i8259 PIC
  pit=<OnOffAuto>        - Enable i8254 PIT
  rtc=<OnOffAuto>        - Enable MC146818 RTC
  x-option-roms=<bool>   - Set off to disable loading option ROMs
`

func TestHelpProps(t *testing.T) {
	p := helpProps(microvmHelp)
	for _, k := range []string{"acpi", "x-option-roms", "auto-kernel-cmdline", "isa-serial"} {
		if !p[k] {
			t.Errorf("%s not found in %v", k, p)
		}
	}
	if p["microvm-machine options:"] || len(p) != 8 {
		t.Errorf("props %v", p)
	}
	b := helpProps("memory-backend-file options:\n  readonly=<bool>\n  rom=<OnOffAuto>        - Whether to create Read Only Memory (ROM)\n")
	if !b["rom"] || !b["readonly"] {
		t.Errorf("backend props %v", b)
	}
}

// TestPlanMachine: the options follow the firmware. SeaBIOS (QEMU 10.0 as
// Debian 13 ships it) loads the kernel through an option ROM, so they stay
// on; qboot (7.2, 8.2) loads it itself, so they go off.
func TestPlanMachine(t *testing.T) {
	all := helpProps(microvmHelp)
	noROMs := helpProps(microvmHelp)
	delete(noROMs, "x-option-roms")
	lacking := helpProps(microvmHelp)
	delete(lacking, "auto-kernel-cmdline")
	tests := []struct {
		name     string
		f        machineFacts
		options  string
		roms     bool
		why      []string
		wantErr  error
		dataDirs []string
	}{
		{
			name:    "qboot",
			f:       machineFacts{Bin: "/usr/bin/q", Microvm: all, Firmware: "/usr/share/qemu/qboot.rom", Kind: firmwareQboot},
			options: qbootOptions,
			why:     []string{"qboot (/usr/share/qemu/qboot.rom)", "option ROMs are off"},
		},
		{
			name:    "SeaBIOS",
			f:       machineFacts{Bin: "/usr/bin/q", Microvm: all, Firmware: "/usr/share/seabios/bios-microvm.bin", Kind: firmwareSeaBIOS},
			options: "microvm,acpi=on,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off",
			roms:    true,
			why:     []string{"SeaBIOS (/usr/share/seabios/bios-microvm.bin)", "through an option ROM", "stay on"},
		},
		{
			name:    "unknown firmware keeps option ROMs",
			f:       machineFacts{Bin: "/usr/bin/q", Microvm: all, Firmware: "/x/bios-microvm.bin", Kind: firmwareUnknown},
			options: "microvm,acpi=on,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off",
			roms:    true,
			why:     []string{"neither qboot nor SeaBIOS"},
		},
		{
			name:    "qboot on a QEMU that cannot turn option ROMs off",
			f:       machineFacts{Bin: "/usr/bin/q", Microvm: noROMs, Firmware: "/q/qboot.rom", Kind: firmwareQboot},
			options: "microvm,acpi=on,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off",
			roms:    true,
		},
		{
			name: "data directories unpacked elsewhere",
			f: machineFacts{Bin: "/opt/q/usr/bin/q", Microvm: all, Firmware: "/opt/q/usr/share/seabios/bios-microvm.bin", Kind: firmwareSeaBIOS,
				Extra: []string{"/opt/q/usr/share/qemu", "/opt/q/usr/share/seabios"}},
			options:  "microvm,acpi=on,pit=off,pic=off,rtc=on,isa-serial=on,auto-kernel-cmdline=off",
			roms:     true,
			dataDirs: []string{"/opt/q/usr/share/qemu", "/opt/q/usr/share/seabios"},
			why:      []string{"passed with -L: /opt/q/usr/share/qemu, /opt/q/usr/share/seabios"},
		},
		{name: "no microvm", f: machineFacts{Bin: "/usr/bin/q"}, wantErr: errdefs.ErrFailedPrecondition},
		{name: "a microvm without an option isopod needs", f: machineFacts{Bin: "/usr/bin/q", Microvm: lacking, Firmware: "/q", Kind: firmwareQboot}, wantErr: errdefs.ErrFailedPrecondition},
		{name: "no firmware", f: machineFacts{Bin: "/usr/bin/q", Microvm: all, SearchPath: []string{"/usr/share/qemu"}}, wantErr: errdefs.ErrFailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := planMachine(tt.f)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %+v, %v; want %v", p, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Options != tt.options || p.OptionROMs != tt.roms || !slices.Equal(p.DataDirs, tt.dataDirs) {
				t.Errorf("got options %q, option ROMs %v, -L %q; want %q, %v, %q", p.Options, p.OptionROMs, p.DataDirs, tt.options, tt.roms, tt.dataDirs)
			}
			assertSentence(t, p.Why)
			for _, w := range tt.why {
				if !strings.Contains(p.Why, w) {
					t.Errorf("why %q lacks %q", p.Why, w)
				}
			}
		})
	}
}

// TestFirmwareSearch: the firmware is the first on the search path, its
// symlinks resolved, told apart by its contents; a QEMU's own data
// directories are added when it does not look there.
func TestFirmwareSearch(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "usr/bin/qemu-system-x86_64")
	own, seabios, system := filepath.Join(root, "usr/share/qemu"), filepath.Join(root, "usr/share/seabios"), filepath.Join(root, "sys/qemu")
	for _, d := range []string{filepath.Dir(bin), own, seabios, system} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(own, "qboot.rom"), "\x00\x00qboot\x00")
	write(filepath.Join(seabios, microvmFirmware), "\x55\xaaSeaBIOS (version 1.16.3)\x00")
	write(filepath.Join(system, "qboot.rom"), "\x00qboot\x00")
	os.Symlink("qboot.rom", filepath.Join(system, microvmFirmware))

	// A QEMU built for another prefix: its own directories come first.
	extra, path := searchPath(bin, []string{system})
	if !slices.Equal(extra, []string{own, seabios}) || !slices.Equal(path, []string{own, seabios, system}) {
		t.Fatalf("searchPath = %q, %q", extra, path)
	}
	if fw, kind := findFirmware(path, microvmFirmware); fw != filepath.Join(seabios, microvmFirmware) || kind != firmwareSeaBIOS {
		t.Errorf("firmware %s (%s); want the unpacked SeaBIOS", fw, kind)
	}
	// A QEMU that looks in its own directories already: nothing added.
	if extra, _ := searchPath(bin, []string{filepath.Join(filepath.Dir(bin), "../share/qemu"), seabios}); len(extra) != 0 {
		t.Errorf("extra = %q; want none", extra)
	}
	// A symlink to qboot is qboot, at its real path.
	if fw, kind := findFirmware([]string{system}, microvmFirmware); fw != filepath.Join(system, "qboot.rom") || kind != firmwareQboot {
		t.Errorf("firmware %s (%s); want qboot", fw, kind)
	}
	if fw, _ := findFirmware([]string{filepath.Join(root, "none")}, microvmFirmware); fw != "" {
		t.Errorf("found %s where there is none", fw)
	}
	write(filepath.Join(root, "other.bin"), "something else")
	if k := firmwareOf(filepath.Join(root, "other.bin")); k != firmwareUnknown {
		t.Errorf("kind %s; want unknown", k)
	}
}

// TestMachineProbeOnce: the plan is asked for once per Driver, and a
// failed probe is asked again.
func TestMachineProbeOnce(t *testing.T) {
	calls := 0
	fail := true
	d := &Driver{bin: "/q", log: testLogger(t), machineProbe: func(context.Context, string) (machineFacts, error) {
		calls++
		if fail {
			return machineFacts{}, errors.New("boom")
		}
		return machineFacts{Bin: "/q", Microvm: helpProps(microvmHelp), Firmware: "/q/qboot.rom", Kind: firmwareQboot}, nil
	}}
	if _, err := d.machine(context.Background()); err == nil {
		t.Fatal("a failed probe gave a plan")
	}
	fail = false
	for range 2 {
		if p, err := d.machine(context.Background()); err != nil || p.Options != qbootOptions {
			t.Fatalf("plan %+v, %v", p, err)
		}
	}
	if calls != 2 {
		t.Errorf("%d probes; want 2", calls)
	}
}

// TestProbeMachineInstalled asks the installed QEMU.
func TestProbeMachineInstalled(t *testing.T) {
	d := newTestDriver(t)
	f, err := probeMachine(context.Background(), factsCache{}, d.bin)
	if err != nil {
		t.Fatal(err)
	}
	p, err := planMachine(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: -machine %s -L %q; %s", d.bin, p.Options, p.DataDirs, p.Why)
	if f.Kind == firmwareUnknown {
		t.Errorf("firmware %s not recognised", f.Firmware)
	}
	// Debian 12's QEMU 7.2 boots microvm with qboot, option ROMs off.
	info, err := d.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(info.Version, "7.2.") && (f.Kind != firmwareQboot || p.Options != qbootOptions) {
		t.Errorf("QEMU %s: firmware %s, options %s; want qboot and %s", info.Version, f.Kind, p.Options, qbootOptions)
	}
}

// assertSentence fails unless s is whole sentences: a capital first
// letter, a full stop at the end.
func assertSentence(t *testing.T, s string) {
	t.Helper()
	if s == "" || !unicode.IsUpper(rune(s[0])) || !strings.HasSuffix(s, ".") {
		t.Errorf("reason %q is not a whole sentence", s)
	}
}

// TestKernelFor: under qboot the uncompressed kernel boots directly; under
// SeaBIOS (or a firmware isopod does not know) the bzImage the config
// names boots instead, and a config naming none keeps its kernel.
func TestKernelFor(t *testing.T) {
	all := helpProps(microvmHelp)
	for _, tc := range []struct {
		kind    firmwareKind
		bz      string
		want    string
		sayBzIm bool
	}{
		{firmwareQboot, "/k/vmlinuz", "/k/vmlinux", false},
		{firmwareSeaBIOS, "/k/vmlinuz", "/k/vmlinuz", true},
		{firmwareUnknown, "/k/vmlinuz", "/k/vmlinuz", true},
		{firmwareSeaBIOS, "", "/k/vmlinux", true},
	} {
		p, err := planMachine(machineFacts{Bin: "/usr/bin/q", Microvm: all, Firmware: "/f/bios-microvm.bin", Kind: tc.kind})
		if err != nil {
			t.Fatal(err)
		}
		d := &Driver{plan: &p}
		if got := d.kernelFor(&vmm.Config{Kernel: "/k/vmlinux", BzImage: tc.bz}); got != tc.want {
			t.Errorf("%s, bzImage %q: boots %s; want %s", tc.kind, tc.bz, got, tc.want)
		}
		if strings.Contains(p.Why, "bzImage") != tc.sayBzIm {
			t.Errorf("%s: why %q", tc.kind, p.Why)
		}
	}
}
