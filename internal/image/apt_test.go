package image

import (
	"errors"
	"strings"
	"testing"

	"pault.ag/go/debian/dependency"

	"isopod/internal/errdefs"
)

// metaStanzas is apt-cache show output for a meta package offered in two
// versions, newest first.
const metaStanzas = `Package: linux-image-cloud-amd64
Source: linux-signed-amd64 (6.1.176+1)
Version: 6.1.176-1
Installed-Size: 13
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: amd64
Provides: linux-latest-modules-6.1.0-50-cloud-amd64
Depends: linux-image-6.1.0-50-cloud-amd64 (= 6.1.176-1)
Description: Linux for x86-64 cloud (meta-package)
 This package depends on the latest Linux kernel and modules for use on
 cloud platforms.
Description-md5: 5b5a10a2c7d9d1a1e0a9b4c3e4f5a6b7
Section: kernel
Priority: optional
Filename: pool/main/l/linux-signed-amd64/linux-image-cloud-amd64_6.1.176-1_amd64.deb
Size: 1484
SHA256: 0f0e0d0c0b0a090807060504030201000f0e0d0c0b0a09080706050403020100

Package: linux-image-cloud-amd64
Version: 6.1.170-1
Architecture: amd64
Depends: linux-image-6.1.0-48-cloud-amd64 (= 6.1.170-1)

`

func TestParseIndexEntry(t *testing.T) {
	e, err := parseIndexEntry("linux-image-cloud-amd64", []byte(metaStanzas))
	if err != nil {
		t.Fatal(err)
	}
	if e.Package != "linux-image-cloud-amd64" || e.Version.String() != "6.1.176-1" || e.Size != 1484 {
		t.Errorf("got %s %s size %d; want the first stanza", e.Package, e.Version, e.Size)
	}
	if e.SHA256 != "0f0e0d0c0b0a090807060504030201000f0e0d0c0b0a09080706050403020100" {
		t.Errorf("SHA256 %q", e.SHA256)
	}
	if !strings.Contains(e.Description, "cloud platforms") {
		t.Errorf("description %q lost its continuation lines", e.Description)
	}
	name, ver, ok := exactDep(e.GetDepends(), "linux-image-")
	if !ok || name != "linux-image-6.1.0-50-cloud-amd64" || ver != "6.1.176-1" {
		t.Errorf("exactDep = %q %q %v; want the first stanza's kernel", name, ver, ok)
	}

	for _, bad := range []string{"", "\n\n", "Version: 1\n"} {
		if _, err := parseIndexEntry("p", []byte(bad)); !errors.Is(err, ErrNotServed) {
			t.Errorf("%q: got %v; want ErrNotServed", bad, err)
		}
	}
	if _, err := parseIndexEntry("p", []byte("Package: p\nVersion: not a version\n")); err == nil || errors.Is(err, ErrNotServed) {
		t.Errorf("bad version: got %v; want a parse error", err)
	}
}

func TestExactDep(t *testing.T) {
	tests := []struct {
		depends   string
		name, ver string
	}{
		{"linux-image-6.1.0-50-cloud-amd64 (= 6.1.176-1)", "linux-image-6.1.0-50-cloud-amd64", "6.1.176-1"},
		{"initramfs-tools | linux-initramfs-tool, linux-image-6.1.0-50-cloud-amd64 (= 6.1.176-1)", "linux-image-6.1.0-50-cloud-amd64", "6.1.176-1"},
		{"linux-image-a (>= 1), linux-image-b (= 2:1.0-1)", "linux-image-b", "2:1.0-1"},
		{"linux-image-a (>= 1)", "", ""},
		{"other | linux-image-a (= 1)", "", ""},
		{"", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.depends, func(t *testing.T) {
			dep, err := dependency.Parse(tt.depends)
			if err != nil {
				t.Fatal(err)
			}
			name, ver, ok := exactDep(*dep, "linux-image-")
			if name != tt.name || ver != tt.ver || ok != (tt.name != "") {
				t.Errorf("got %q %q %v; want %q %q", name, ver, ok, tt.name, tt.ver)
			}
		})
	}
}

func TestShowNotServed(t *testing.T) {
	apt := fakeApt(t, "exit 1", `echo "N: Unable to locate package $2" >&2; echo "E: No packages found" >&2; exit 100`)
	_, err := apt.Show(t.Context(), "nope", "1")
	if !errors.Is(err, ErrNotServed) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("got %v; want ErrNotServed, a failed precondition", err)
	}
}
