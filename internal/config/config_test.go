package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/oci"
	"isopod/internal/settings"
)

// env is a lookup over a fixed environment.
func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

func TestJail(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		value string // "<unset>" leaves the variable out
		want  settings.JailMode
		class error // nil: accepted
		says  []string
	}{
		{"<unset>", settings.JailDefault, nil, nil},
		{"", settings.JailDefault, nil, nil},
		{"0", settings.JailOff, nil, nil},
		{"off", settings.JailOff, nil, nil},
		{" OFF ", settings.JailOff, nil, nil},
		{"1", settings.JailOn, nil, nil},
		{"on", settings.JailOn, nil, nil},
		{"yes", 0, errdefs.ErrInvalidArgument, []string{`"yes"`, "1 or on", "0 or off"}},
		{"true", 0, errdefs.ErrInvalidArgument, []string{"1 or on", "0 or off"}},
	} {
		vars := map[string]string{knobs.Home: home}
		if tt.value != "<unset>" {
			vars[knobs.Jail] = tt.value
		}
		s, err := Load(env(vars))
		if tt.class == nil {
			if err != nil || s.Jail != tt.want {
				t.Errorf("%s=%q: jail %v, err %v; want %v", knobs.Jail, tt.value, s.Jail, err, tt.want)
			}
			continue
		}
		if !errors.Is(err, tt.class) {
			t.Errorf("%s=%q: err %v; want %v", knobs.Jail, tt.value, err, tt.class)
			continue
		}
		for _, w := range tt.says {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s=%q: error %q does not say %q", knobs.Jail, tt.value, err, w)
			}
		}
	}
}

func TestRegistryStall(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		window, floor string // "" leaves the variable out
		want          oci.Stall
		bad           string // the variable a refusal names
	}{
		{"", "", oci.Stall{Window: 60 * time.Second, MinRate: 10 << 10}, ""},
		{"1", "", oci.Stall{Window: time.Second, MinRate: 10 << 10}, ""},
		{" 5 ", "0", oci.Stall{Window: 5 * time.Second}, ""},
		{"", "64", oci.Stall{Window: 60 * time.Second, MinRate: 64 << 10}, ""},
		{"0", "", oci.Stall{}, knobs.RegistryStallS},
		{"1.5", "", oci.Stall{}, knobs.RegistryStallS},
		{"", "-1", oci.Stall{}, knobs.RegistryMinKiBps},
		{"", "fast", oci.Stall{}, knobs.RegistryMinKiBps},
	} {
		vars := map[string]string{knobs.Home: home}
		if tt.window != "" {
			vars[knobs.RegistryStallS] = tt.window
		}
		if tt.floor != "" {
			vars[knobs.RegistryMinKiBps] = tt.floor
		}
		s, err := Load(env(vars))
		if tt.bad == "" {
			if err != nil || s.RegistryStall != tt.want {
				t.Errorf("%q/%q: stall %+v, err %v; want %+v", tt.window, tt.floor, s.RegistryStall, err, tt.want)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), tt.bad) {
			t.Errorf("%q/%q: err %v; want a refusal naming %s", tt.window, tt.floor, err, tt.bad)
		}
	}
}

// TestVMM: ISOPOD_VMM selects a VMM driver the core knows (qemu, the
// default); any other is refused before a service is built, naming the
// known ones.
func TestVMM(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		value string // "<unset>" leaves the variable out
		want  string
		ok    bool
	}{
		{"<unset>", "", true},
		{"", "", true},
		{"qemu", "qemu", true},
		{" QEMU ", "qemu", true},
		{"firecracker", "", false},
		{"kvm", "", false},
	} {
		vars := map[string]string{knobs.Home: home}
		if tt.value != "<unset>" {
			vars[knobs.VMM] = tt.value
		}
		s, err := Load(env(vars))
		if !tt.ok {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s=%q: err %v; want invalid argument", knobs.VMM, tt.value, err)
				continue
			}
			for _, w := range []string{knobs.VMM, fmt.Sprintf("%q", tt.value), "use qemu"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s=%q: error %q does not say %q", knobs.VMM, tt.value, err, w)
				}
			}
			continue
		}
		if err != nil || s.VMM != tt.want {
			t.Errorf("%s=%q: vmm %q, err %v; want %q", knobs.VMM, tt.value, s.VMM, err, tt.want)
			continue
		}
		svc, err := s.NewService(nil, "test")
		if err != nil {
			t.Errorf("%s=%q: NewService: %v", knobs.VMM, tt.value, err)
			continue
		}
		svc.Close()
	}
}

// TestHostIO checks the MCP server's host-I/O switches as read: unset or
// an on value is on, an off value is off, anything else is off with a
// warning; the root is kept as given, set or not.
func TestHostIO(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		name      string
		vars      map[string]string
		stdin     bool
		copyOut   bool
		workspace bool
		warn      string
	}{
		{"unset", nil, true, true, true, ""},
		{"off", map[string]string{knobs.MCPCopyOut: "off", knobs.MCPStdinFile: "0", knobs.MCPWorkspace: "No"}, false, false, false, ""},
		{"explicit on", map[string]string{knobs.MCPCopyOut: "Yes", knobs.MCPStdinFile: "1", knobs.MCPWorkspace: ""}, true, true, true, ""},
		{"unknown is off", map[string]string{knobs.MCPCopyOut: "maybe"}, true, false, true, knobs.MCPCopyOut + `="maybe" is not on or off; treating it as off`},
	} {
		vars := map[string]string{knobs.Home: home}
		for k, v := range tt.vars {
			vars[k] = v
		}
		s, err := Load(env(vars))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		h := s.HostIO
		if h.StdinFile != tt.stdin || h.CopyOut != tt.copyOut || h.Workspace != tt.workspace {
			t.Errorf("%s: stdin_file %v copy_out %v workspace %v; want %v %v %v", tt.name, h.StdinFile, h.CopyOut, h.Workspace, tt.stdin, tt.copyOut, tt.workspace)
		}
		if got := strings.Join(h.Warnings, "\n"); got != tt.warn {
			t.Errorf("%s: warnings %q; want %q", tt.name, got, tt.warn)
		}
		if h.RootSet {
			t.Errorf("%s: the root is set though %s is not", tt.name, knobs.MCPHostIORoot)
		}
	}
	s, err := Load(env(map[string]string{knobs.Home: home, knobs.MCPHostIORoot: " "}))
	if err != nil || !s.HostIO.RootSet || s.HostIO.Root != " " {
		t.Errorf("%s=\" \": root %q set %v, err %v; want it kept as given", knobs.MCPHostIORoot, s.HostIO.Root, s.HostIO.RootSet, err)
	}
}

// TestCredentialMaxBody: the credential endpoint's body cap is read in MiB;
// unset leaves the endpoint's default, and a value that is not a whole
// number of MiB from 1 up is refused naming the variable.
func TestCredentialMaxBody(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		value string
		want  int64
		ok    bool
	}{
		{"<unset>", 0, true},
		{"1", 1 << 20, true},
		{" 512 ", 512 << 20, true},
		{"0", 0, false},
		{"-3", 0, false},
		{"1.5", 0, false},
		{"lots", 0, false},
	} {
		vars := map[string]string{knobs.Home: home}
		if tt.value != "<unset>" {
			vars[knobs.CredentialMaxBodyMiB] = tt.value
		}
		s, err := Load(env(vars))
		if !tt.ok {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), knobs.CredentialMaxBodyMiB) {
				t.Errorf("%q: err %v; want invalid argument naming %s", tt.value, err, knobs.CredentialMaxBodyMiB)
			}
			continue
		}
		if err != nil || s.CredentialMaxBody != tt.want {
			t.Errorf("%q: %d, %v; want %d", tt.value, s.CredentialMaxBody, err, tt.want)
		}
	}
}

// TestEnviron: a child's environment carries the settings as the front
// end read them (through its lookup, not the process's environment), the
// state root and kernel resolved, and drops what the base said of them.
func TestEnviron(t *testing.T) {
	home := t.TempDir()
	s, err := Load(env(map[string]string{knobs.Home: home, knobs.Kernel: "k/vmlinux", knobs.WarmPool: "off", knobs.QEMU: "/opt/q"}))
	if err != nil {
		t.Fatal(err)
	}
	// A front end's own limits (isopod-mcp's --max-vms) reach the child.
	s.MaxVMs, s.MemoryBudgetMiB = 3, 2048
	got := s.Environ([]string{"PATH=/bin", knobs.Home + "=/elsewhere", knobs.Jail + "=off", "HOME=/root"})
	kernel, _ := filepath.Abs("k/vmlinux")
	want := []string{"PATH=/bin", "HOME=/root", knobs.Home + "=" + home, knobs.Kernel + "=" + kernel, knobs.QEMU + "=/opt/q", knobs.WarmPool + "=off",
		knobs.MaxVMs + "=3", knobs.MemoryBudgetMiB + "=2048"}
	if !slices.Equal(got, want) {
		t.Errorf("Environ = %q\nwant %q", got, want)
	}
	again, err := Load(func(k string) (string, bool) {
		for _, kv := range got {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v, true
			}
		}
		return "", false
	})
	if err != nil || again.Paths.Home != s.Paths.Home || again.Kernel != s.Kernel || !again.NoWarmPool || again.QEMU != "/opt/q" || again.Jail != s.Jail ||
		again.MaxVMs != 3 || again.MemoryBudgetMiB != 2048 {
		t.Errorf("settings read back from Environ differ: %+v, %v", again.Settings, err)
	}
}

// TestSessionDiskBudget: what paused sessions may hold is read in MiB,
// 20480 unless set, 0 for no budget.
func TestSessionDiskBudget(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		value string
		want  int64
		ok    bool
	}{
		{"<unset>", DefaultSessionDiskBudgetMiB << 20, true},
		{"0", 0, true},
		{" 100 ", 100 << 20, true},
		{"-1", 0, false},
		{"much", 0, false},
	} {
		vars := map[string]string{knobs.Home: home}
		if tt.value != "<unset>" {
			vars[knobs.SessionDiskBudgetMiB] = tt.value
		}
		s, err := Load(env(vars))
		if !tt.ok {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), knobs.SessionDiskBudgetMiB) {
				t.Errorf("%q: err %v; want invalid argument naming %s", tt.value, err, knobs.SessionDiskBudgetMiB)
			}
			continue
		}
		if err != nil || s.SessionDiskBudget != tt.want {
			t.Errorf("%q: %d, %v; want %d", tt.value, s.SessionDiskBudget, err, tt.want)
		}
	}
}
