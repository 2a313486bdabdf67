package image

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// writeStaticELF writes the smallest file LocateAgent accepts: an x86-64
// ELF executable header with no program headers (so no interpreter).
func writeStaticELF(t testing.TB, path string) {
	t.Helper()
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Ehsize: 64, Phentsize: 56, Shentsize: 64,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
}

// replace sets *p to v for the rest of the test.
func replace[T any](t testing.TB, p *T, v T) {
	t.Helper()
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// TestLocateAgentOrder lays out a checkout, a prefix install and the
// packages' place, and checks that each is found only when the ones
// before it are absent.
func TestLocateAgentOrder(t *testing.T) {
	root := t.TempDir()
	prefix := filepath.Join(root, "prefix")
	exe := filepath.Join(prefix, "bin", "isopod")
	system := filepath.Join(root, "usr-lib-isopod")
	replace(t, &executable, func() (string, error) { return exe, nil })
	replace(t, &systemAgentDir, system)
	pathDir := filepath.Join(root, "path")
	t.Setenv("PATH", pathDir)

	explicit := filepath.Join(root, "explicit", AgentBinaryName)
	nextTo := filepath.Join(prefix, "bin", AgentBinaryName)
	inPrefix := filepath.Join(prefix, "lib", "isopod", AgentBinaryName)
	inSystem := filepath.Join(system, AgentBinaryName)
	onPath := filepath.Join(pathDir, AgentBinaryName)
	all := []string{explicit, nextTo, inPrefix, inSystem, onPath}
	for _, p := range all {
		writeStaticELF(t, p)
	}
	for i, want := range all {
		arg := ""
		if i == 0 {
			arg = explicit
		}
		got, err := LocateAgent(arg)
		if err != nil || got != want {
			t.Errorf("with %s and later present: got %q, %v; want %q", strings.TrimPrefix(want, root), got, err, want)
		}
		if err := os.Remove(want); err != nil {
			t.Fatal(err)
		}
	}
	_, err := LocateAgent("")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("none present: err %v; want failed precondition", err)
	}
	for _, says := range []string{system, "lib/isopod", "reinstall the isopod package", "CGO_ENABLED=0 go build", "ISOPOD_AGENT_BIN"} {
		if !strings.Contains(err.Error(), says) {
			t.Errorf("none present: error %q does not say %q", err, says)
		}
	}
}
