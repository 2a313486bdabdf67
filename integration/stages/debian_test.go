package stages

import (
	"isopod/integration/e2e"

	"archive/zip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDebianToolchain(t *testing.T) {
	e2e.RequireDebian(t)
	base := []string{"--no-network", "--base", "base-debian", "--"}
	r := e2e.Run(t, append(base, "python3", "-c", "import sys; print(sys.version)")...)
	if !strings.HasPrefix(e2e.Str(r.JSON, "stdout"), "3.") {
		t.Errorf("python3: %s", r.Stdout)
	}
	r = e2e.Run(t, append(base, "node", "-e", "console.log(1)")...)
	if e2e.Str(r.JSON, "stdout") != "1\n" {
		t.Errorf("node: %s", r.Stdout)
	}
	prog := "#include <stdio.h>\nint main(void) { printf(\"c works %d\\n\", 6 * 7); return 0; }\n"
	cfile := filepath.Join(t.TempDir(), "m.c")
	os.WriteFile(cfile, []byte(prog), 0o600)
	r = e2e.Run(t, "--no-network", "--base", "base-debian", "--stdin-file", cfile, "--",
		"sh", "-c", "cat > /root/m.c && gcc -o /root/m /root/m.c && /root/m")
	if e2e.Str(r.JSON, "stdout") != "c works 42\n" {
		t.Errorf("gcc: %s", r.Stdout)
	}
}

// writeWheel builds a minimal pure-Python wheel for package isopodprobe.
func writeWheel(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zip.NewWriter(f)
	files := []struct{ name, body string }{
		{"isopodprobe/__init__.py", "ANSWER = 42\n"},
		{"isopodprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: isopodprobe\nVersion: 1.0\n"},
		{"isopodprobe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: isopod-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"isopodprobe-1.0.dist-info/RECORD", "isopodprobe/__init__.py,,\nisopodprobe-1.0.dist-info/METADATA,,\nisopodprobe-1.0.dist-info/WHEEL,,\nisopodprobe-1.0.dist-info/RECORD,,\n"},
	}
	for _, fl := range files {
		w, err := z.Create(fl.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(fl.body))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDebianPipInstallCommittedAndForked(t *testing.T) {
	e2e.RequireDebian(t)
	whl := filepath.Join(t.TempDir(), "isopodprobe-1.0-py3-none-any.whl")
	writeWheel(t, whl)
	l := label(t, "pip")
	rmStages(t, l)
	r := e2e.Run(t, "--no-network", "--base", "base-debian", "--stdin-file", whl, "--commit-as", l, "--",
		"sh", "-c", "cat > /tmp/isopodprobe-1.0-py3-none-any.whl && pip install --no-index /tmp/isopodprobe-1.0-py3-none-any.whl")
	if e2e.Num(t, r.JSON, "exit_code") != 0 || e2e.Str(r.JSON, "stage_id") == "" {
		t.Fatalf("pip install: %s", r.Stdout)
	}
	r = e2e.Run(t, "--no-network", "--stage", l, "--", "python3", "-c", "import isopodprobe; print(isopodprobe.ANSWER)")
	if e2e.Str(r.JSON, "stdout") != "42\n" {
		t.Errorf("fork cannot import the installed package: %s", r.Stdout)
	}
	// A fork keeps its chain's base; --base that disagrees is refused.
	e2e.RunFail(t, nil, "base-min", "run", "--no-network", "--stage", l, "--base", "base-min", "--", "true")
}
