package image

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
)

func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	chunks := map[int64][]byte{
		0:              bytes.Repeat([]byte("a"), 4096),
		10 << 20:       bytes.Repeat([]byte("b"), 100000),
		size - 5:       []byte("tail!"),
		(30 << 20) + 7: []byte("odd offset"),
	}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	os.WriteFile(dst, bytes.Repeat([]byte("x"), 1<<20), 0o644) // stale content must go
	if err := CopySparse(dst, src); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from source")
	}
	if got := allocated(t, dst); got > 4<<20 {
		t.Errorf("copy allocates %d bytes for ~110 KB of data: holes were filled", got)
	}
	if err := CopySparse(filepath.Join(dir, "d2"), dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("directory source: %v", err)
	}
}

func TestScratchTemplate(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed")
	}
	paths := testPaths(t)
	if _, err := ScratchTemplate(paths, 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("tiny size: %v", err)
	}
	const mib = 1024
	start := time.Now()
	p, err := ScratchTemplate(paths, mib)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("template of %d MiB made in %s, %d bytes allocated", mib, time.Since(start).Round(time.Millisecond), allocated(t, p))
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != mib<<20 {
		t.Fatalf("template %v %v", fi, err)
	}
	if again, err := ScratchTemplate(paths, mib); err != nil || again != p {
		t.Errorf("second call: %q %v", again, err)
	}
	if out, err := exec.Command("dumpe2fs", "-h", p).CombinedOutput(); err == nil {
		for _, want := range []string{"Filesystem UUID:          " + scratchUUID, "isopod-scratch"} {
			if !bytes.Contains(out, []byte(want)) {
				t.Errorf("dumpe2fs lacks %q", want)
			}
		}
		if bytes.Contains(out, []byte("has_journal")) {
			t.Error("template has a journal")
		}
	}
	dst := filepath.Join(t.TempDir(), "scratch.ext4")
	start = time.Now()
	if err := CopySparse(dst, p); err != nil {
		t.Fatal(err)
	}
	t.Logf("CopySparse of the %d MiB template: %s, %d bytes allocated", mib, time.Since(start).Round(time.Microsecond), allocated(t, dst))
	if out, err := exec.Command("e2fsck", "-fn", dst).CombinedOutput(); err != nil {
		t.Errorf("e2fsck on the copy: %v\n%s", err, out)
	}
}

// TestScratchTemplateOnUserPath: with the PATH a normal user has on
// Debian (no /usr/sbin, where mkfs.ext4 is), the template is still made.
func TestScratchTemplateOnUserPath(t *testing.T) {
	if _, err := hosttool.Find("mkfs.ext4"); err != nil {
		t.Skip(err)
	}
	t.Setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
	if _, err := ScratchTemplate(testPaths(t), MinScratchTemplateMiB); err != nil {
		t.Errorf("PATH without sbin: %v", err)
	}
}
