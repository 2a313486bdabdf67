package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/stages"
	"isopod/internal/vmm/vmmfake"
)

// writeImported records an imported base called name whose image sets env
// and workdir, with or without /bin/sh.
func writeImported(t *testing.T, p paths.Paths, name string, env []string, workdir string, shell bool) {
	t.Helper()
	identity := "sha256:" + sandboxtest.Digest([]byte(name))
	id := image.ImportedContentID(image.ImportRecipe, identity)
	data := []byte("not a squashfs: " + name)
	dir := filepath.Dir(image.StoredPath(p, id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sandboxtest.WriteFile(t, filepath.Join(dir, "base.sqfs"), data)
	sandboxtest.WriteJSON(t, filepath.Join(dir, "base.json"), image.BaseInfo{
		Flavor: name, Name: name, Kind: image.KindImported, Recipe: image.ImportRecipe, ContentSHA256: id,
		ProtocolVersion: agentproto.Version, Size: int64(len(data)), SquashfsSHA256: sandboxtest.Digest(data),
		Image: &image.ImageSource{Source: "oci:/nowhere", Identity: identity, Env: env, WorkingDir: workdir, Shell: shell},
	})
}

func TestRunTakesAnImportedBasesDefaults(t *testing.T) {
	t.Parallel()
	var set settings.Settings
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { o.NoWarmPool, set = true, o.Settings })
	p := set.Paths
	writeImported(t, p, "img", []string{"FOO=image", "BAR=image"}, "/usr", true)
	writeImported(t, p, "bare", nil, "", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"sh", "-c", `echo "$FOO $BAR"; pwd`}, Base: "img", Env: []string{"BAR=run"}, NoNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stdout != "image run\n/usr\n" || rep.RootfsFlavor != "img" {
		t.Errorf("stdout %q over %s; want the image's env under the run's, its working directory", rep.Stdout, rep.RootfsFlavor)
	}
	rep, err = s.Run(ctx, sandbox.Request{Argv: []string{"pwd"}, Base: "img", Cwd: "/", NoNetwork: true})
	if err != nil || rep.Stdout != "/\n" {
		t.Errorf("--cwd over the image's: %q, %v", rep.Stdout, err)
	}

	_, err = s.Run(ctx, sandbox.Request{Argv: []string{"/bin/sh", "-c", "true"}, Shell: true, Base: "bare", NoNetwork: true})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "no /bin/sh") {
		t.Errorf("a shell command over a base without /bin/sh: %v; want a refusal saying so", err)
	}
	if _, err := s.Run(ctx, sandbox.Request{Argv: []string{"true"}, Base: "bare", NoNetwork: true}); err != nil {
		t.Errorf("argv over a base without /bin/sh: %v", err)
	}
	list, err := stages.New(stages.Options{Settings: set}).ImageList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, e := range list.Images {
		kinds[e.Flavor] = e.Kind
	}
	if kinds["img"] != image.KindImported || kinds["base-min"] != image.KindBuilt {
		t.Errorf("image list kinds %v", kinds)
	}
}
