package image

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

// fakeBase publishes a base sidecar and image the way packAndPublish does.
func fakeBase(t *testing.T, paths paths.Paths, flavor string, proto int) {
	t.Helper()
	p := BasePath(paths, flavor)
	data := []byte("sqsh" + flavor)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	info := BaseInfo{Flavor: flavor, Recipe: baseRecipes[flavor], ContentSHA256: sha256Bytes(data), ProtocolVersion: proto, Size: int64(len(data)), Inputs: []Pin{BusyboxPin}}
	if err := writeJSONAtomic(sidecarPath(p), info); err != nil {
		t.Fatal(err)
	}
}

func TestListImagesAndLookupBase(t *testing.T) {
	paths := testPaths(t)
	fakeBase(t, paths, FlavorBaseMin, agentproto.Version)
	fakeBase(t, paths, FlavorBaseDebian, agentproto.Version+1)
	list, err := ListImages(paths, "", filepath.Join(t.TempDir(), "none"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ImageInfo{}
	for _, ii := range list {
		got[ii.Flavor] = ii
	}
	if ii := got[FlavorInitramfs]; ii.Built {
		t.Errorf("initramfs reported built: %+v", ii)
	}
	if ii := got[FlavorBaseMin]; !ii.Built || ii.Stale || ii.ContentSHA256 == "" || ii.Size == 0 {
		t.Errorf("base-min: %+v", ii)
	}
	// A base holds no agent: another protocol does not make it stale.
	if ii := got[FlavorBaseDebian]; !ii.Built || ii.Stale {
		t.Errorf("base-debian of another protocol: %+v", ii)
	}
	if _, err := LookupBase(paths, FlavorBaseMin); err != nil {
		t.Errorf("lookup base-min: %v", err)
	}
	// A file that is not what its record says is stale.
	if err := os.WriteFile(BasePath(paths, FlavorBaseDebian), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupBase(paths, FlavorBaseDebian); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "isopod image build base-debian") {
		t.Errorf("stale lookup: %v", err)
	}
	// A base made by an earlier recipe (base-min before its busybox
	// changed) is stale, and the refusal says how to rebuild it and what
	// that means for stages.
	side := sidecarPath(BasePath(paths, FlavorBaseMin))
	var info BaseInfo
	if err := readJSON(side, &info); err != nil {
		t.Fatal(err)
	}
	info.Recipe--
	if err := writeJSONAtomic(side, info); err != nil {
		t.Fatal(err)
	}
	_, err = LookupBase(paths, FlavorBaseMin)
	for _, want := range []string{"build recipe", "isopod image build base-min", "stages made over the old build"} {
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) {
			t.Errorf("lookup of an earlier recipe's base-min: got %v; want a failed precondition mentioning %q", err, want)
		}
	}
	if _, ok := currentBase(paths, FlavorBaseMin, nil); ok {
		t.Error("an earlier recipe's base-min is current; want it rebuilt")
	}
	if _, err := LookupBase(paths, "base-nope"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown flavor: %v", err)
	}
	empty := testPaths(t)
	if _, err := LookupBase(empty, FlavorBaseMin); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "isopod image build-all") {
		t.Errorf("unbuilt lookup: %v", err)
	}
}

// buildStaticBinary compiles a tiny static program to stand in for the agent.
func buildStaticBinary(t *testing.T, dir, name, msg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("compiles a Go program")
	}
	src := filepath.Join(dir, name+".go")
	os.WriteFile(src, []byte("package main\nfunc main() { println(\""+msg+"\") }\n"), 0o644)
	out := filepath.Join(dir, name)
	cmd := exec.Command(runtime.GOROOT()+"/bin/go", "build", "-o", out, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GO111MODULE=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func TestInitramfsBuildAndStaleness(t *testing.T) {
	dir := t.TempDir()
	agent := buildStaticBinary(t, dir, "agent", "one")
	kernel := filepath.Join(dir, "bzImage")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	paths := testPaths(t)
	opts := BuildOptions{Kernel: kernel, AgentBin: agent}
	if _, err := ResolveBoot(paths, kernel); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("boot before build: %v", err)
	}
	info, err := BuildInitramfs(t.Context(), paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !info.BuiltInKernel || len(info.Modules) != 0 || info.ProtocolVersion != agentproto.Version || filepath.Base(info.Path) != "initramfs-builtin.cpio" {
		t.Errorf("info %+v", info)
	}
	boot, err := ResolveBoot(paths, kernel)
	if err != nil || boot.Kernel != kernel || boot.Initramfs != info.Path {
		t.Errorf("boot %+v %v", boot, err)
	}
	if again, err := BuildInitramfs(t.Context(), paths, opts); err != nil || !again.Cached {
		t.Errorf("rebuild with same inputs: cached=%v %v", again.Cached, err)
	}
	// Reproducible: a forced rebuild from the same inputs is byte-identical.
	if forced, err := BuildInitramfs(t.Context(), paths, BuildOptions{Kernel: kernel, AgentBin: agent, Force: true}); err != nil || forced.Cached || forced.ContentSHA256 != info.ContentSHA256 {
		t.Errorf("forced rebuild: cached=%v sha %s, first %s (%v)", forced.Cached, forced.ContentSHA256, info.ContentSHA256, err)
	}
	ii := initramfsStatus(paths, kernel, agent)
	if !ii.Built || ii.Stale {
		t.Errorf("fresh initramfs: %+v", ii)
	}
	// A new agent build makes the initramfs stale.
	agent2 := buildStaticBinary(t, dir, "agent2", "two")
	if ii := initramfsStatus(paths, kernel, agent2); !ii.Stale || !strings.Contains(ii.StaleReason, "agent") {
		t.Errorf("after agent change: %+v", ii)
	}
	// Extract with the cpio tool and check the layout the agent expects.
	if _, err := exec.LookPath("cpio"); err == nil {
		out := t.TempDir()
		f, _ := os.Open(info.Path)
		defer f.Close()
		cmd := exec.Command("cpio", "-id", "--quiet", "--no-absolute-filenames")
		cmd.Dir, cmd.Stdin = out, f
		if b, err := cmd.CombinedOutput(); err != nil && !strings.Contains(string(b), "console") {
			t.Fatalf("cpio: %v %s", err, b)
		}
		for _, p := range []string{"init", "etc/isopod/modules", "proc", "sys", "run", "tmp", "dev"} {
			if _, err := os.Stat(filepath.Join(out, p)); err != nil {
				t.Errorf("initramfs lacks /%s", p)
			}
		}
	}
}

func TestLocateAgentRejectsDynamic(t *testing.T) {
	// The test binary itself may be static or not; /bin/sh on Debian is dynamic.
	f, err := elf.Open("/bin/sh")
	if err != nil {
		t.Skip("/bin/sh not an ELF here")
	}
	dynamic := false
	for _, p := range f.Progs {
		dynamic = dynamic || p.Type == elf.PT_INTERP
	}
	f.Close()
	if !dynamic {
		t.Skip("/bin/sh is static here")
	}
	_, err = LocateAgent("/bin/sh")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "CGO_ENABLED=0 go build") || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("got %v", err)
	}
	txt := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(txt, []byte("#!/bin/sh\n"), 0o755)
	if _, err := LocateAgent(txt); !errors.Is(err, ErrNotELF) {
		t.Errorf("script: %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	replace(t, &systemAgentDir, t.TempDir())
	if _, err := LocateAgent(""); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("missing agent: %v", err)
	}
}

func TestBuildUnknownFlavor(t *testing.T) {
	_, err := Build(t.Context(), testPaths(t), "base-nope", BuildOptions{})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "base-debian") {
		t.Errorf("got %v", err)
	}
}

func TestSameModules(t *testing.T) {
	kernel := []string{"kernel/drivers/virtio/virtio.ko", "kernel/fs/overlayfs/overlay.ko"}
	for _, tt := range []struct {
		built []string
		want  bool
	}{
		{[]string{"lib/modules/6.1/kernel/drivers/virtio/virtio.ko", "lib/modules/6.1/kernel/fs/overlayfs/overlay.ko"}, true},
		{[]string{"lib/modules/6.1/kernel/fs/overlayfs/overlay.ko", "lib/modules/6.1/kernel/drivers/virtio/virtio.ko"}, false},
		{[]string{"lib/modules/6.1/kernel/drivers/virtio/virtio.ko"}, false},
		{nil, false},
	} {
		if got := sameModules(tt.built, kernel); got != tt.want {
			t.Errorf("sameModules(%v) = %v; want %v", tt.built, got, tt.want)
		}
	}
}
