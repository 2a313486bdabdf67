package image

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"isopod/internal/errdefs"
)

func TestHostMirror(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"deb822", map[string]string{
			"sources.list.d/debian.sources": "Types: deb\n# http://snapshot.example/x\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n\n" +
				"Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n",
		}, "http://mirror.example/debian"},
		{"one-line with options", map[string]string{
			"sources.list": "# deb http://commented.example/debian bookworm main\ndeb-src http://src.example/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n",
		}, "http://one.example/debian"},
		{"disabled stanza skipped", map[string]string{
			"sources.list.d/a.sources": "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n",
			"sources.list.d/b.sources": "Types: deb deb-src\nURIs: http://on.example/debian\nSuites: bookworm\n",
		}, "http://on.example/debian"},
		{"none", map[string]string{"sources.list": "deb http://x.example/debian trixie main\n"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for p, body := range tt.files {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
				os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644)
			}
			got, err := hostMirror(dir, "bookworm")
			if tt.want == "" {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Errorf("got %q, %v; want a failed precondition", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
