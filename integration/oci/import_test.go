package oci

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
)

// shellLayer is a root with busybox as /bin/sh and the applets the checks
// use, and marker as /etc/id.
func shellLayer(t testing.TB, marker string) []entry {
	ents := []entry{dirEntry("bin/"), {name: "bin/busybox", body: string(staticBusybox(t)), typ: tar.TypeReg, mode: 0o755},
		fileEntry("etc/id", marker+"\n", 0o644), dirEntry("work/")}
	for _, a := range []string{"sh", "cat", "stat", "readlink", "ls"} {
		ents = append(ents, symEntry("bin/"+a, "busybox"))
	}
	return ents
}

// richImage is an image whose layers hold a whiteout, an opaque
// directory, a hard link, a link out of the tree (and a file written
// through it), a setuid file, a file of another owner and a device node.
// escape is the host directory the link points at.
func richImage(t testing.TB, marker, escape string) v1.Image {
	rel := strings.TrimPrefix(escape, "/")
	l1 := append(shellLayer(t, marker),
		fileEntry("etc/greeting", "hello\n", 0o644), fileEntry("gone/file", "x", 0o644),
		fileEntry("opq/lower", "x", 0o644), fileEntry("opq/sub/lower2", "x", 0o644))
	l2 := []entry{
		fileEntry(".wh.gone", "", 0o644),
		fileEntry("opq/.wh..wh..opq", "", 0o644), fileEntry("opq/upper", "upper\n", 0o644),
		{name: "lib/hl", link: "etc/greeting", typ: tar.TypeLink, mode: 0o644},
		symEntry("escape", strings.Repeat("../", 12)+rel),
		{name: "usr/bin/suid", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o4755},
		{name: "home/user/private", body: "p", typ: tar.TypeReg, mode: 0o640, uid: 1000, gid: 1000},
		{name: "dev/mydev", typ: tar.TypeChar, mode: 0o600, major: 1, minor: 3},
	}
	l3 := []entry{fileEntry("escape/planted", "guest\n", 0o644)}
	return image(t, "amd64", []string{"PATH=/bin:/usr/bin", "FOO=image"}, "/work",
		layer(t, l1...), layer(t, l2...), layer(t, l3...))
}

// importOK imports source as name and returns the result.
func importOK(t *testing.T, env []string, source, name string, extra ...string) map[string]any {
	t.Helper()
	r := e2e.Isopod(t, env, append([]string{"image", "import", source, "--name", name}, extra...)...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("import %s failed:\n%s", source, r)
	}
	return r.JSON
}

// runOut runs argv over a base and returns its stdout, failing unless the
// command exits 0.
func runOut(t *testing.T, env []string, args ...string) string {
	t.Helper()
	r := e2e.Isopod(t, env, append([]string{"run", "--no-network"}, args...)...)
	if r.Code != 0 || r.JSON["ok"] != true || e2e.Num(t, r.JSON, "exit_code") != 0 {
		t.Fatalf("run %v:\n%s", args, r)
	}
	return e2e.Str(r.JSON, "stdout")
}

func TestImportFromARegistry(t *testing.T) {
	e2e.RequireVM(t)
	// Outside /tmp, which the guest mounts a tmpfs over.
	escape, err := os.MkdirTemp("/var/tmp", "isopod-escape-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(escape) })
	reg := startRegistry(t)
	other := image(t, "arm64", nil, "", layer(t, fileEntry("etc/id", "arm\n", 0o644)))
	reg.push(t, "test/rich:v1", index(map[string]v1.Image{"amd64": richImage(t, "registry", escape), "arm64": other}))

	res := importOK(t, nil, "docker://"+reg.ref("test/rich:v1"), "rich")
	if !strings.Contains(strings.Join(strAny(res["skipped"]), " "), "/dev/mydev (char device 1:3)") || res["shell"] != true {
		t.Errorf("import result: %v; want /dev/mydev skipped and a shell", res)
	}
	if _, err := os.Stat(filepath.Join(escape, "planted")); err == nil {
		t.Fatal("importing wrote through the image's link onto the host")
	}
	out := runOut(t, nil, "--base", "rich", "--", "sh", "-c", `set -e
cat /etc/greeting /etc/id
test ! -e /gone && test ! -e /opq/lower && test ! -e /opq/sub && cat /opq/upper
stat -c '%a %u %g' /usr/bin/suid /home/user/private
[ "$(stat -c %i /etc/greeting)" = "$(stat -c %i /lib/hl)" ] && echo linked
readlink /escape
cat /`+strings.TrimPrefix(escape, "/")+`/planted
test ! -e /dev/mydev && echo "FOO=$FOO" && pwd`)
	want := "hello\nregistry\nupper\n4755 0 0\n640 1000 1000\nlinked\n" + strings.Repeat("../", 12) + strings.TrimPrefix(escape, "/") +
		"\nguest\nFOO=image\n/work\n"
	if out != want {
		t.Errorf("the guest sees:\n%s\nwant:\n%s", out, want)
	}
	if out := runOut(t, nil, "--base", "rich", "--env", "FOO=mine", "--cwd", "/", "--", "sh", "-c", `echo "$FOO"; pwd`); out != "mine\n/\n" {
		t.Errorf("--env and --cwd over the image's defaults: %q; want mine and /", out)
	}
	ls := e2e.Isopod(t, nil, "image", "ls")
	found := false
	for _, im := range ls.JSON["images"].([]any) {
		m := im.(map[string]any)
		if m["base"] == "rich" {
			found = m["kind"] == "imported" && strings.Contains(e2e.Str(m, "source"), "test/rich:v1") &&
				strings.HasPrefix(e2e.Str(m, "digest"), "sha256:") && e2e.Num(t, m, "size_bytes") > 0
		}
	}
	if !found {
		t.Errorf("image ls does not show rich with its kind, source, digest and size:\n%s", ls)
	}
	again := importOK(t, nil, reg.ref("test/rich:v1"), "rich")
	if again["cached"] != true || again["content_sha256"] != res["content_sha256"] {
		t.Errorf("importing the same image again: %v; want it cached with the same content id", again)
	}
}

func TestImportFromAnOCILayoutAndADockerArchive(t *testing.T) {
	e2e.RequireVM(t)
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// zstd layers, as an OCI layout may hold.
	img := image(t, "amd64", []string{"SRC=layout"}, "", zstdLayer(t, shellLayer(t, "layout")...))
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	importOK(t, nil, "oci:"+dir+":v1", "from-layout")
	if out := runOut(t, nil, "--base", "from-layout", "--", "sh", "-c", `cat /etc/id; echo "$SRC"`); out != "layout\nlayout\n" {
		t.Errorf("from the layout: %q", out)
	}
	e2e.RunFail(t, nil, "no image tagged", "image", "import", "oci:"+dir+":v2", "--name", "nope")

	archive := filepath.Join(t.TempDir(), "saved.tar")
	aimg := image(t, "amd64", []string{"SRC=archive"}, "", layer(t, shellLayer(t, "archive")...))
	tag, _ := name.NewTag("example.invalid/saved:v1")
	if err := tarball.WriteToFile(archive, tag, aimg); err != nil {
		t.Fatal(err)
	}
	res := importOK(t, nil, "docker-archive:"+archive, "from-archive")
	if e2e.Str(res, "digest") != "" {
		t.Errorf("a docker-save archive has no manifest digest to report; got %v", res["digest"])
	}
	if out := runOut(t, nil, "--base", "from-archive", "--", "sh", "-c", `cat /etc/id; echo "$SRC"`); out != "archive\narchive\n" {
		t.Errorf("from the archive: %q", out)
	}
	// A damaged blob in a layout is refused, and nothing is left behind.
	dimg := image(t, "amd64", []string{"SRC=damaged"}, "", layer(t, shellLayer(t, "damaged")...))
	if err := lp.AppendImage(dimg, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v3"})); err != nil {
		t.Fatal(err)
	}
	blob := onlyLayerBlob(t, dimg)
	p := filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(blob, "sha256:"))
	b, _ := os.ReadFile(p)
	b[len(b)/2] ^= 0xff
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	before := storedBases(t)
	r := e2e.RunFail(t, nil, "does not match its digest", "image", "import", "oci:"+dir+":v3", "--name", "damaged")
	if r.JSON["class"] != "failed_precondition" {
		t.Errorf("class %v; want failed_precondition", r.JSON["class"])
	}
	if after := storedBases(t); after != before {
		t.Errorf("images/ changed after a refused import: %s -> %s", before, after)
	}
}

func onlyLayerBlob(t *testing.T, img v1.Image) string {
	ls, err := img.Layers()
	if err != nil || len(ls) != 1 {
		t.Fatalf("layers: %v %d", err, len(ls))
	}
	d, _ := ls[0].Digest()
	return d.String()
}

// storedBases lists what images/ and images/bases hold.
func storedBases(t *testing.T) string {
	var names []string
	for _, d := range []string{"images", "images/bases"} {
		ents, _ := os.ReadDir(filepath.Join(e2e.HomeDir, d))
		for _, e := range ents {
			names = append(names, d+"/"+e.Name())
		}
	}
	return strings.Join(names, ",")
}

func TestImportWithoutAShell(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	// Only /opt/busybox and a file: no /bin/sh, no /proc, /sys, /dev,
	// /tmp, /run or /root for the agent to mount on.
	img := image(t, "amd64", nil, "", layer(t,
		entry{name: "opt/busybox", body: string(staticBusybox(t)), typ: tar.TypeReg, mode: 0o755}, fileEntry("etc/x", "bare\n", 0o644)))
	reg.push(t, "test/bare:v1", img)
	res := importOK(t, nil, reg.ref("test/bare:v1"), "bare")
	if res["shell"] != false {
		t.Errorf("shell = %v; want false", res["shell"])
	}
	if out := runOut(t, nil, "--base", "bare", "--", "/opt/busybox", "cat", "/etc/x"); out != "bare\n" {
		t.Errorf("cat over a bare root: %q", out)
	}
	out := runOut(t, nil, "--base", "bare", "--", "/opt/busybox", "ls", "-d", "/proc/self", "/sys/kernel", "/dev/null", "/tmp", "/run", "/root")
	if strings.Count(out, "\n") != 6 {
		t.Errorf("the agent's mount points over a bare root: %q", out)
	}
	r := e2e.Isopod(t, nil, "run", "--no-network", "--base", "bare", "--", "/no/such/program")
	if r.Code != 0 || e2e.Num(t, r.JSON, "exit_code") != 127 {
		t.Errorf("a missing program: %s; want exit 127", r)
	}
	cs := startMCP(t)
	call, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_run", Arguments: map[string]any{"cmd": "true", "base": "bare"}})
	if err != nil {
		t.Fatal(err)
	}
	if !call.IsError || !strings.Contains(e2e.ToolText(call), "no /bin/sh") {
		t.Errorf("sandbox_run over a base without /bin/sh: %s; want a refusal saying so", e2e.ToolText(call))
	}
}

func TestImportRefusals(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	arm := image(t, "arm64", nil, "", layer(t, fileEntry("etc/id", "arm\n", 0o644)))
	reg.push(t, "test/arm:index", index(map[string]v1.Image{"arm64": arm}))
	reg.push(t, "test/arm:single", arm)
	good := image(t, "amd64", nil, "", layer(t, fileEntry("etc/id", "good\n", 0o644)))
	reg.push(t, "test/good:v1", good)
	big := image(t, "amd64", nil, "", layer(t, fileEntry("big", strings.Repeat("x", 3<<20), 0o644)))
	reg.push(t, "test/big:v1", big)
	odd, err := mutate.Append(empty.Image, mutate.Addendum{Layer: layer(t, fileEntry("a", "a", 0o644)), MediaType: "application/vnd.example.layer"})
	if err != nil {
		t.Fatal(err)
	}
	reg.push(t, "test/odd:v1", odd)
	reg.push(t, "test/artifact:v1", mutate.ConfigMediaType(good, "application/vnd.example.config+json"))

	for _, c := range []struct{ source, name, want, class string }{
		{reg.ref("test/arm:index"), "arm", "no linux/amd64 image", "not_supported"},
		{reg.ref("test/arm:single"), "arm", "linux/arm64 image", "not_supported"},
		{reg.ref("test/good:missing"), "good", "not in the registry", "not_found"},
		{reg.ref("test/odd:v1"), "odd", "unsupported layer media type", "not_supported"},
		{reg.ref("test/artifact:v1"), "artifact", "not a container image", "invalid_argument"},
		{reg.ref("test/big:v1"), "big", "cap of 1 MiB", "invalid_argument"},
		{reg.ref("test/good:v1"), "base-min", "reserved", "invalid_argument"},
		{"containers-storage:x", "x", "not supported", "invalid_argument"},
	} {
		r := e2e.RunFail(t, nil, c.want, "image", "import", c.source, "--name", c.name, "--max-mib", "1")
		if r.JSON["class"] != c.class {
			t.Errorf("%s: class %v; want %s", c.source, r.JSON["class"], c.class)
		}
	}

	// A blob the registry damages is refused and leaves nothing.
	reg.tamperWith(onlyLayerBlob(t, good))
	before := storedBases(t)
	e2e.RunFail(t, nil, "does not match its digest", "image", "import", reg.ref("test/good:v1"), "--name", "good")
	if after := storedBases(t); after != before {
		t.Errorf("images/ changed after a refused import: %s -> %s", before, after)
	}
	reg.tamperWith("")

	// A registry that wants credentials gets Docker's, from DOCKER_CONFIG.
	reg.requireAuth("alice", "s3cret")
	r := e2e.RunFail(t, []string{"DOCKER_CONFIG=" + t.TempDir()}, "refused access", "image", "import", reg.ref("test/good:v1"), "--name", "good")
	if r.JSON["class"] != "failed_precondition" || !strings.Contains(e2e.Str(r.JSON, "error"), "docker login") {
		t.Errorf("without credentials: %s", r)
	}
	importOK(t, []string{"DOCKER_CONFIG=" + dockerConfig(t, reg.Host, "alice", "s3cret")}, reg.ref("test/good:v1"), "good")
}

func TestImageRemove(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	reg.push(t, "test/rm:v1", image(t, "amd64", nil, "", layer(t, shellLayer(t, "rm")...)))
	importOK(t, nil, reg.ref("test/rm:v1"), "removable")
	e2e.Run(t, "--no-network", "--base", "removable", "--commit-as", "rm/user", "--", "sh", "-c", "echo x > /root/x")
	e2e.RunFail(t, nil, "in use by stage", "image", "rm", "removable")
	if r := e2e.Isopod(t, nil, "stage", "rm", "rm/user"); r.Code != 0 {
		t.Fatal(r)
	}
	// Runs over a base leave warm-pool snapshots of it, which the refusal
	// names with the command that removes them.
	for {
		r := e2e.Isopod(t, nil, "image", "rm", "removable")
		if r.Code == 0 {
			if r.JSON["removed"] != "removable" {
				t.Fatalf("image rm: %s", r)
			}
			break
		}
		msg := e2e.Str(r.JSON, "error")
		_, rest, found := strings.Cut(msg, "`isopod warmpool rm ")
		key, _, _ := strings.Cut(rest, "`")
		if !found || !strings.HasPrefix(key, "wk-") {
			t.Fatalf("image rm: %s", r)
		}
		ok(t, nil, "warmpool", "rm", key)
	}
	e2e.RunFail(t, nil, "unknown base", "run", "--base", "removable", "--", "true")
	e2e.RunFail(t, nil, "built here", "image", "rm", "base-min")
}

func strAny(v any) []string {
	var out []string
	for _, x := range asSlice(v) {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
