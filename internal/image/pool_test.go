package image

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"isopod/internal/errdefs"
)

// fakeMirror serves files (pool path to body) under /debian and records
// the paths asked for.
type fakeMirror struct {
	*httptest.Server
	mu       sync.Mutex // guards following
	requests []string
}

func newFakeMirror(t *testing.T, files map[string][]byte) *fakeMirror {
	t.Helper()
	m := &fakeMirror{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.requests = append(m.requests, r.URL.Path)
		m.mu.Unlock()
		body, ok := files[strings.TrimPrefix(r.URL.Path, "/debian/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *fakeMirror) URI() string { return m.URL + "/debian" }

func (m *fakeMirror) Requests() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.requests)
}

// replacePin swaps *p for v until the test ends.
func replacePin(t *testing.T, p *Pin, v Pin) {
	t.Helper()
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

func TestFetchFromPool(t *testing.T) {
	body := []byte("a package")
	pin := Pin{Package: "p", Version: "1:2.0-1", SHA256: sha256Bytes(body), Filename: "pool/main/p/p/p_2.0-1_amd64.deb"}
	full := newFakeMirror(t, map[string][]byte{pin.Filename: body})
	empty := newFakeMirror(t, nil)
	bad := newFakeMirror(t, map[string][]byte{pin.Filename: []byte("tampered")})
	log := testLogger(t)

	t.Run("first mirror without it is passed over", func(t *testing.T) {
		dir := t.TempDir()
		got, err := fetchFromPool(t.Context(), nil, log, dir, []string{empty.URI(), full.URI()}, pin)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(got); string(b) != string(body) || filepath.Dir(got) != dir || filepath.Base(got) != "p_2.0-1_amd64.deb" {
			t.Errorf("got %s holding %q; want %s/p_2.0-1_amd64.deb holding %q", got, b, dir, body)
		}
		if r := empty.Requests(); len(r) == 0 || r[len(r)-1] != "/debian/"+pin.Filename {
			t.Errorf("empty mirror asked for %v; want the pool path", r)
		}
	})
	t.Run("digest mismatch is refused at once", func(t *testing.T) {
		dir := t.TempDir()
		before := len(full.Requests())
		_, err := fetchFromPool(t.Context(), nil, log, dir, []string{bad.URI(), full.URI()}, pin)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "sha256 mismatch") || !strings.Contains(err.Error(), pin.SHA256) {
			t.Errorf("got %v; want a sha256 mismatch naming the pin", err)
		}
		if n := len(full.Requests()); n != before {
			t.Errorf("after a mismatch another mirror was asked (%d requests)", n-before)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("refused download left %v", left)
		}
	})
	t.Run("no mirror has it", func(t *testing.T) {
		_, err := fetchFromPool(t.Context(), nil, log, t.TempDir(), []string{empty.URI(), "http://127.0.0.1:1/debian"}, pin)
		if !errors.Is(err, ErrNotServed) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), pin.Filename) {
			t.Errorf("got %v; want not served, unavailable, naming the pool path", err)
		}
	})
	t.Run("pool path must be relative", func(t *testing.T) {
		for _, f := range []string{"", "/etc/passwd", "pool/../../x.deb"} {
			p := pin
			p.Filename = f
			if _, err := fetchFromPool(t.Context(), nil, log, t.TempDir(), []string{full.URI()}, p); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: got %v; want invalid argument", f, err)
			}
		}
	})
}

func TestPoolMirrors(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "sources.list.d", "debian.sources"), []byte(
		"Types: deb\nURIs: http://local.example/debian/\nSuites: bookworm bookworm-updates\n\n"+
			"Types: deb\nURIs: http://local.example/debian-security\nSuites: bookworm-security\n\n"+
			"Types: deb\nURIs: http://local.example/debian\nSuites: trixie\n\n"+
			"Types: deb\nURIs: file:///srv/repo\nSuites: local\n"), 0o644)
	tests := []struct {
		name, explicit, etcApt string
		want                   []string
	}{
		{"explicit alone", "http://m.example/debian/", dir, []string{"http://m.example/debian"}},
		{"host sources, then the default", "", dir, []string{"http://local.example/debian", "http://local.example/debian-security", DefaultDebianMirror}},
		{"no host sources", "", filepath.Join(dir, "none"), []string{DefaultDebianMirror}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := poolMirrors(tt.explicit, tt.etcApt); !slices.Equal(got, tt.want) {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

// TestBuildBaseMinFromMirror builds base-min from a fake mirror whose
// busybox is a script that lists applets the way busybox --list-full does.
func TestBuildBaseMinFromMirror(t *testing.T) {
	if _, err := exec.LookPath("mksquashfs"); err != nil {
		t.Skip("mksquashfs not installed")
	}
	applets := "bin/sh\nbin/ls\nbin/cat\nbin/tar\nusr/bin/wget\nusr/bin/nc\nusr/bin/nslookup\nusr/bin/timeout\nusr/bin/sha256sum\nusr/bin/awk\nsbin/ip\nlinuxrc\n"
	script := "#!/bin/sh\n[ \"$1\" = --list-full ] && printf '" + strings.ReplaceAll(applets, "\n", `\n`) + "'\n"
	deb := makeDebWith(t, t.TempDir(), "bb.deb", "Package: busybox-static\nVersion: 1:9.9-1\nArchitecture: amd64\n", ".xz",
		map[string]string{"usr/bin/busybox": script, "usr/share/doc/busybox-static/copyright": "GPL-2"})
	data, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	pin := Pin{Package: "busybox-static", Version: "1:9.9-1", SHA256: sha256Bytes(data), Filename: "pool/main/b/busybox/busybox-static_9.9-1_amd64.deb"}
	replacePin(t, &BusyboxPin, pin)
	mirror := newFakeMirror(t, map[string][]byte{pin.Filename: data})
	paths := testPaths(t)
	opts := BuildOptions{Logger: testLogger(t), Mirror: mirror.URI() + "/"}
	info, err := BuildBaseMin(t.Context(), paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cached || len(info.Inputs) != 1 || info.Inputs[0] != pin || info.Recipe != baseRecipes[FlavorBaseMin] {
		t.Errorf("info %+v; want a fresh build of the pin by recipe %d", info, baseRecipes[FlavorBaseMin])
	}
	out, err := exec.Command("unsquashfs", "-lln", info.Path).Output()
	if err != nil {
		t.Skipf("unsquashfs: %v", err)
	}
	for _, p := range []string{"/bin/busybox", "/usr/bin/wget", "/linuxrc"} {
		if !strings.Contains(string(out), "squashfs-root"+p+" ") && !strings.Contains(string(out), "squashfs-root"+p+"\n") {
			t.Errorf("image lacks %s:\n%s", p, out)
		}
	}
	if strings.Contains(string(out), "copyright") {
		t.Error("image holds the package's other files")
	}
	n := len(mirror.Requests())
	if again, err := BuildBaseMin(t.Context(), paths, opts); err != nil || !again.Cached || len(mirror.Requests()) != n {
		t.Errorf("second build: cached=%v, %d more requests, %v; want the current image and no download", again.Cached, len(mirror.Requests())-n, err)
	}
}
