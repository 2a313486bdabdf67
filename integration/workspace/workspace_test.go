// Package workspace tests `isopod run --workspace` end to end: a host
// directory copied into real VMs, and what the command changed brought back
// as a patch that git apply accepts.
package workspace

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// cold makes a run boot instead of resuming a snapshot.
var cold = []string{"ISOPOD_WARM_POOL=off"}

// run is an `isopod run` that must succeed as an isopod call, with env
// added, and whose stdout must be exactly one JSON object.
func run(t *testing.T, env []string, args ...string) *e2e.Result {
	t.Helper()
	r := e2e.Isopod(t, env, append([]string{"run"}, args...)...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run %v failed:\n%s", args, r)
	}
	oneJSONObject(t, r.Stdout)
	return r
}

// oneJSONObject fails unless stdout holds one JSON object and nothing else.
func oneJSONObject(t *testing.T, stdout []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(stdout))
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("stdout holds more than one JSON object:\n%s", stdout)
	}
}

// wsReport is the report's workspace block.
func wsReport(t *testing.T, r *e2e.Result) map[string]any {
	t.Helper()
	w, ok := r.JSON["workspace"].(map[string]any)
	if !ok {
		t.Fatalf("report has no workspace block:\n%s", r.Stdout)
	}
	return w
}

// sections splits a guest's stdout at its "== name ==" lines.
func sections(stdout string) map[string]string {
	out := map[string]string{}
	name := ""
	for _, line := range strings.SplitAfter(stdout, "\n") {
		if strings.HasPrefix(line, "== ") && strings.HasSuffix(line, " ==\n") {
			name = strings.TrimSuffix(strings.TrimPrefix(line, "== "), " ==\n")
			continue
		}
		out[name] += line
	}
	return out
}

// stdinScript writes a guest script for --stdin-file; the guest runs it
// with `sh -c guestScript`, so its own commands see no stdin.
func stdinScript(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(p, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const guestScript = `cat > /tmp/script.sh && exec sh /tmp/script.sh </dev/null`

// noSecrets fails if b holds a secret of the fixture.
func noSecrets(t *testing.T, what string, b []byte) {
	t.Helper()
	for _, s := range []string{secretPass, secretHeader, secretOutside} {
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("%s holds the secret %q", what, s)
		}
	}
}

// credentialsRemoved checks the report names exactly the fixture's
// credentials.
func credentialsRemoved(t *testing.T, w map[string]any) {
	t.Helper()
	got, _ := w["credentials_removed"].([]any)
	var names []string
	for _, g := range got {
		s, _ := g.(string)
		names = append(names, s)
	}
	if strings.Join(names, "|") != strings.Join(credentialNames, "|") {
		t.Errorf("credentials_removed: got %q; want %q", names, credentialNames)
	}
}

// noCredentialsIn checks a guest's `git config --list` output.
func noCredentialsIn(t *testing.T, config string) {
	t.Helper()
	if !strings.Contains(config, "remote.origin.url=https://x.example/r.git\n") {
		t.Errorf("guest's git config lacks the remote, less its user info:\n%s", config)
	}
	for _, bad := range []string{"credential.helper", "extraheader", "user:", "@x.example"} {
		if strings.Contains(config, bad) {
			t.Errorf("guest's git config still holds %q:\n%s", bad, config)
		}
	}
}

func num(w map[string]any, key string) (int64, bool) {
	v, ok := w[key].(float64)
	return int64(v), ok
}

// Caps and bad destinations are refused before any VM starts: quickly,
// naming the number and the flag, with no QEMU.
func TestWorkspaceRefusedBeforeBoot(t *testing.T) {
	e2e.RequireVM(t)
	f := newFixture(t)
	before := snapshot(t, f.Dir)
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	symlink(t, filepath.Join(dir, "target"), link)
	file := filepath.Join(dir, "file")
	write(t, file, "not a directory\n", 0o644)

	caps := []struct {
		args []string
		want []string
	}{
		{[]string{"--workspace-max-files", "5"}, []string{"limit of 5;", "or raise --workspace-max-files"}},
		{[]string{"--workspace-max-bytes", "100"}, []string{"limit of 100 ", "or raise --workspace-max-bytes"}},
		{[]string{"--workspace-max-files", "3", "--workspace-max-bytes", "100"},
			[]string{"limit of 3; narrow it (.gitignore, a subdirectory), or raise --workspace-max-files",
				"limit of 100 (100 B); narrow it (.gitignore, a subdirectory), or raise --workspace-max-bytes"}},
	}
	others := []struct {
		args []string
		want string
	}{
		{[]string{"--workspace", f.Dir, "--workspace-out", link}, "symlink"},
		{[]string{"--workspace", f.Dir, "--workspace-out", filepath.Join(dir, "missing", "x.patch")}, "does not exist"},
		{[]string{"--workspace-out", filepath.Join(dir, "x.patch")}, "--workspace-out needs --workspace"},
		{[]string{"--workspace-all"}, "--workspace-all needs --workspace"},
		{[]string{"--workspace", f.Dir + ":/proc/x"}, "/proc"},
		{[]string{"--workspace", f.Dir + ":/"}, "guest directory"},
		{[]string{"--workspace", f.Dir, "--workspace-max-files", "0"}, "positive"},
		{[]string{"--workspace", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--workspace", file}, "not a directory"},
	}
	refuse := func(args []string, want ...string) {
		t.Helper()
		start := time.Now()
		r := e2e.RunFail(t, nil, want[0], append(append([]string{"run", "--no-network"}, args...), "--", "true")...)
		oneJSONObject(t, r.Stdout)
		for _, w := range want[1:] {
			if !strings.Contains(e2e.Str(r.JSON, "error"), w) {
				t.Errorf("%v: error %q does not say %q", args, e2e.Str(r.JSON, "error"), w)
			}
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%v: refusal took %v; it must come before any VM starts", args, d)
		}
	}
	records := vmRecords(t)
	for _, c := range others {
		refuse(c.args, c.want)
	}
	if after := vmRecords(t); len(after) != len(records) {
		t.Errorf("refused runs made %d VM records", len(after)-len(records))
	}
	for _, c := range caps {
		refuse(append([]string{"--workspace", f.Dir}, c.args...), c.want...)
	}
	// A cap is found by copying the tree, in the run's VM directory: no
	// VMM started for it, and nothing of the copy is left.
	seen := map[string]bool{}
	for _, vm := range records {
		seen[vm] = true
	}
	for _, vm := range vmRecords(t) {
		if seen[vm] {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(e2e.HomeDir, "vms", vm, "record.json"))
		var rec struct {
			VMMPID int `json:"vmm_pid"`
		}
		json.Unmarshal(b, &rec)
		if rec.VMMPID != 0 {
			t.Errorf("a refused run started a VMM (pid %d)", rec.VMMPID)
		}
		ents, _ := os.ReadDir(filepath.Join(e2e.HomeDir, "vms", vm))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "workspace") {
				t.Errorf("a refused run left %s in vms/%s", e.Name(), vm)
			}
		}
		if pids := e2e.QEMUPIDs(t, vm); len(pids) > 0 {
			t.Errorf("QEMU running for %s: %v", vm, pids)
		}
	}
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))
}

// The main round trip, booted cold on base-debian: what the guest sees of
// a git repository, and a patch of every kind of change that git apply
// takes on a pristine copy, giving the guest's tree byte for byte.
func TestWorkspaceGitRoundTripCold(t *testing.T) {
	e2e.RequireDebian(t)
	f := newFixture(t)
	before, outsideBefore := snapshot(t, f.Dir), snapshot(t, filepath.Dir(f.Outside))
	patch := filepath.Join(t.TempDir(), "out.patch")
	script := `
echo "== pwd =="; pwd
echo "== status =="; git status --porcelain 2>&1
echo "== config =="; git config --list 2>&1
echo "== not root =="; find . ! -user 0 -o ! -group 0
echo "== present =="
for p in debug.log build build/out.o sub/deep/trace.log sub/local.cfg fifo notes.txt .gitignore sub/.gitignore .git/HEAD naïve.txt; do
	if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi
done
echo "== link-out =="
readlink link-out
if cat link-out 2>/dev/null; then echo readable; else echo unreadable; fi
echo "== exec =="
for p in run.sh tool.py a.txt; do [ -x "$p" ] && echo "$p"; done
echo "== changes =="
set -e
echo new > added.txt
mkdir -p newdir/inner && echo deep > newdir/inner/n.txt
{ printf '\000\001\002binary\377\n'; head -c 3000 /dev/urandom; } > newbin.bin
printf 'one\nTWO\nthree\nfour\n' > edit.txt
rm gone.txt
chmod -x run.sh
chmod +x tool.py
head -c 4096 /dev/urandom > bin.dat
ln -sfn README.md link-swap
rm -rf rmdir
rm -rf olddir && echo 'now a file' > olddir
rm sub/deep/f.txt && mkdir sub/deep/f.txt && echo inside > sub/deep/f.txt/inside
ln -s newdir/inner/n.txt link-new
echo changed >> 'sp ace.txt'
echo café > café.txt
echo ignored > new.log
echo done
echo "== manifest =="
python3 - "$PWD" <<'PY'
` + manifestPy + `
PY
`
	r := run(t, cold, "--base", "base-debian", "--no-network", "--workspace", f.Dir, "--workspace-out", patch,
		"--stdin-file", stdinScript(t, script), "--", "sh", "-c", guestScript)
	if got := e2e.Str(r.JSON, "path"); got != "cold" {
		t.Errorf("path: got %q; want cold under ISOPOD_WARM_POOL=off", got)
	}
	if code, _ := num(r.JSON, "exit_code"); code != 0 || r.JSON["exit_code"] == nil {
		t.Fatalf("the guest script failed:\n%s", r)
	}
	s := sections(e2e.Str(r.JSON, "stdout"))
	if s["pwd"] != "/workspace\n" {
		t.Errorf("default cwd: got %q; want /workspace", s["pwd"])
	}
	// git in the guest: no "dubious ownership", the untracked file and
	// nothing else.
	if s["status"] != "?? notes.txt\n" {
		t.Errorf("git status --porcelain in the guest: got %q; want only the untracked file", s["status"])
	}
	noCredentialsIn(t, s["config"])
	if s["not root"] != "" {
		t.Errorf("entries not owned by root in the guest:\n%s", s["not root"])
	}
	if want := "notes.txt\n.gitignore\nsub/.gitignore\n.git/HEAD\nnaïve.txt\n"; s["present"] != want {
		t.Errorf("present in the guest: got\n%s\nwant (no ignored file, no FIFO)\n%s", s["present"], want)
	}
	if want := f.Outside + "\nunreadable\n"; s["link-out"] != want {
		t.Errorf("the link out of the tree: got %q; want it to dangle: %q", s["link-out"], want)
	}
	if s["exec"] != "run.sh\n" {
		t.Errorf("executables in the guest: got %q; want run.sh", s["exec"])
	}
	if s["changes"] != "done\n" {
		t.Fatalf("the guest's changes failed: %q\nstderr: %s", s["changes"], e2e.Str(r.JSON, "stderr"))
	}

	w := wsReport(t, r)
	if w["host"] != f.Dir || w["guest"] != "/workspace" || w["git"] != true || w["out"] != patch {
		t.Errorf("workspace host/guest/git/out: %v %v %v %v", w["host"], w["guest"], w["git"], w["out"])
	}
	if n, _ := num(w, "files"); n < 20 {
		t.Errorf("workspace.files %d: want every entry copied, .git included", n)
	}
	if n, _ := num(w, "bytes"); n < 4096 {
		t.Errorf("workspace.bytes %d", n)
	}
	for _, key := range []string{"in_ms", "out_ms", "patch_bytes"} {
		if _, ok := num(w, key); !ok {
			t.Errorf("workspace.%s missing: %v", key, w)
		}
	}
	if w["patch_error"] != nil {
		t.Errorf("patch_error: %v", w["patch_error"])
	}
	credentialsRemoved(t, w)
	if skipped, _ := w["skipped"].(map[string]any); skipped["fifo"] != float64(1) {
		t.Errorf("workspace.skipped: got %v; want the FIFO (which git never lists) counted", w["skipped"])
	}
	noSecrets(t, "the report", r.Stdout)
	changed, _ := w["changed"].(map[string]any)
	if a, _ := num(changed, "added"); a != 7 {
		t.Errorf("changed.added %d; want 7: %v", a, changed)
	}
	if m, _ := num(changed, "modified"); m != 6 {
		t.Errorf("changed.modified %d; want 6: %v", m, changed)
	}
	if d, _ := num(changed, "deleted"); d != 5 {
		t.Errorf("changed.deleted %d; want 5: %v", d, changed)
	}

	// The patch: its size as reported, without the ignored addition, and
	// taken by git apply on a pristine copy, which then equals the guest's
	// tree (less that ignored addition).
	pb, err := os.ReadFile(patch)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := num(w, "patch_bytes"); n != int64(len(pb)) {
		t.Errorf("patch_bytes %d; the file holds %d", n, len(pb))
	}
	if bytes.Contains(pb, []byte("new.log")) {
		t.Errorf("the patch adds the ignored new.log:\n%s", pb)
	}
	noSecrets(t, "the patch", pb)
	if st, err := os.Stat(patch); err == nil && st.Mode().Perm()&0o022 != 0 {
		t.Errorf("patch mode %v: group or other may write it", st.Mode())
	}
	pristine := pristineCopy(t, f, false)
	applyPatch(t, pristine, patch)
	var guest []string
	for _, line := range strings.SplitAfter(s["manifest"], "\n") {
		if line != "" && !strings.HasPrefix(line, "new.log\t") {
			guest = append(guest, line)
		}
	}
	if got, want := hostManifest(t, pristine), strings.Join(guest, ""); got != want {
		t.Errorf("the patched copy differs from the guest's tree:\nhost:\n%s\nguest:\n%s", got, want)
	}

	// isopod never wrote the host tree, nor what its link points at.
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))
	sameSnapshot(t, "the outside link's directory", outsideBefore, snapshot(t, filepath.Dir(f.Outside)))
}

// A warm run (resumed from a snapshot) with --workspace-all and a guest
// directory of its own: ignored files come along, the FIFO is counted, the
// credentials still go, and the patch carries what git would ignore.
func TestWorkspaceAllWarm(t *testing.T) {
	e2e.RequireDebian(t)
	f := newFixture(t)
	before := snapshot(t, f.Dir)
	patch := filepath.Join(t.TempDir(), "warm.patch")
	script := `
echo "== pwd =="; pwd
echo "== present =="
for p in debug.log build/out.o sub/deep/trace.log sub/local.cfg fifo notes.txt; do
	if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi
done
echo "== config =="; git config --list 2>&1
echo "== status =="; git status --porcelain 2>&1
echo "== changes =="
echo warm > warm.txt && echo warm-log > warm.log && echo done
`
	r := run(t, nil, "--base", "base-debian", "--no-network", "--workspace", f.Dir+":/src", "--workspace-all",
		"--workspace-out", patch, "--stdin-file", stdinScript(t, script), "--", "sh", "-c", guestScript)
	if got := e2e.Str(r.JSON, "path"); got != "warm" {
		t.Errorf("path: got %q; want warm", got)
	}
	s := sections(e2e.Str(r.JSON, "stdout"))
	if s["pwd"] != "/src\n" {
		t.Errorf("cwd with GUESTDIR /src: got %q", s["pwd"])
	}
	if want := "debug.log\nbuild/out.o\nsub/deep/trace.log\nsub/local.cfg\nnotes.txt\n"; s["present"] != want {
		t.Errorf("present with --workspace-all: got\n%s\nwant\n%s", s["present"], want)
	}
	noCredentialsIn(t, s["config"])
	if s["status"] != "?? notes.txt\n" {
		t.Errorf("git status --porcelain: got %q", s["status"])
	}
	if s["changes"] != "done\n" {
		t.Fatalf("the guest's changes failed: %q\nstderr: %s", s["changes"], e2e.Str(r.JSON, "stderr"))
	}
	w := wsReport(t, r)
	if w["guest"] != "/src" || w["git"] != false {
		t.Errorf("workspace guest %v git %v; want /src and false (--workspace-all)", w["guest"], w["git"])
	}
	if skipped, _ := w["skipped"].(map[string]any); skipped["fifo"] != float64(1) {
		t.Errorf("workspace.skipped: got %v; want the FIFO counted", w["skipped"])
	}
	credentialsRemoved(t, w)
	noSecrets(t, "the report", r.Stdout)
	changed, _ := w["changed"].(map[string]any)
	if a, _ := num(changed, "added"); a != 2 || changed["modified"] != float64(0) || changed["deleted"] != float64(0) {
		t.Errorf("changed: %v; want warm.txt and warm.log added", changed)
	}
	pristine := pristineCopy(t, f, true)
	applyPatch(t, pristine, patch)
	for name, want := range map[string]string{"warm.txt": "warm\n", "warm.log": "warm-log\n"} {
		if b, err := os.ReadFile(filepath.Join(pristine, name)); err != nil || string(b) != want {
			t.Errorf("%s after git apply: %q, %v", name, b, err)
		}
	}
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))
}

// A command that times out writes no patch: an existing destination stays
// byte for byte as it was. The workspace here is a plain directory (no
// git), on base-min, booted cold.
func TestWorkspaceTimeoutWritesNoPatch(t *testing.T) {
	e2e.RequireVM(t)
	requireHostTools(t)
	dir := filepath.Join(t.TempDir(), "plain")
	write(t, filepath.Join(dir, "f.txt"), "plain\n", 0o644)
	write(t, filepath.Join(dir, "sub/g.txt"), "below\n", 0o644)
	symlink(t, "f.txt", filepath.Join(dir, "l"))
	if err := mkfifo(filepath.Join(dir, "p")); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	dest := filepath.Join(outDir, "keep.patch")
	write(t, dest, "a patch from before\n", 0o600)
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(dest, old, old)
	destBefore, treeBefore := snapshot(t, outDir), snapshot(t, dir)

	start := time.Now()
	r := run(t, cold, "--no-network", "--timeout-s", "20", "--workspace", dir, "--workspace-out", dest,
		"--", "sh", "-c", "pwd; ls -A; echo x > new; sleep 600")
	if took := time.Since(start); took > 45*time.Second {
		t.Errorf("a 20 s timeout took %v", took)
	}
	if r.JSON["timed_out"] != true || r.JSON["exit_code"] != nil {
		t.Fatalf("timed_out %v exit_code %v; want a timeout:\n%s", r.JSON["timed_out"], r.JSON["exit_code"], r)
	}
	// A boot slower than the timeout (a loaded host under TCG) times out
	// before the command starts: then there is no guest's view to check.
	if exec, _ := num(r.JSON, "exec_ms"); exec == 0 && e2e.Str(r.JSON, "stdout") == "" {
		t.Logf("the boot took the whole timeout (boot_ms %v); the guest's view is not checked", r.JSON["boot_ms"])
	} else if got := e2e.Str(r.JSON, "stdout"); got != "/workspace\nf.txt\nl\nsub\n" {
		t.Errorf("stdout before the timeout: got %q; want the cwd and the copy, no FIFO", got)
	}
	w := wsReport(t, r)
	if w["git"] != false {
		t.Errorf("workspace.git %v for a directory outside git", w["git"])
	}
	if skipped, _ := w["skipped"].(map[string]any); skipped["fifo"] != float64(1) {
		t.Errorf("workspace.skipped: got %v; want the FIFO counted", w["skipped"])
	}
	for _, key := range []string{"patch_bytes", "changed", "patch_error", "out_ms"} {
		if w[key] != nil {
			t.Errorf("a timed-out run reports workspace.%s %v", key, w[key])
		}
	}
	sameSnapshot(t, "the destination's directory", destBefore, snapshot(t, outDir))
	sameSnapshot(t, "the host tree", treeBefore, snapshot(t, dir))
	if pids := e2e.QEMUPIDs(t, e2e.Str(r.JSON, "vm_id")); len(pids) > 0 {
		t.Errorf("QEMU still running: %v", pids)
	}
}

// --commit-as keeps the run's other changes but never the workspace; a
// patch over --workspace-max-patch-bytes is a patch_error in a report that
// otherwise stands, and the destination is left alone.
func TestWorkspaceCommitAndPatchCap(t *testing.T) {
	e2e.RequireVM(t)
	f := newFixture(t)
	before := snapshot(t, f.Dir)
	outDir := t.TempDir()
	dest := filepath.Join(outDir, "capped.patch")
	write(t, dest, "a patch from before\n", 0o644)
	destBefore := snapshot(t, outDir)

	r := run(t, nil, "--no-network", "--commit-as", "ws/committed", "--workspace", f.Dir,
		"--workspace-out", dest, "--workspace-max-patch-bytes", "2000", "--",
		"sh", "-c", "echo kept > /root/kept.txt && head -c 50000 /dev/urandom > big.bin && echo small > small.txt")
	if code, _ := num(r.JSON, "exit_code"); code != 0 || r.JSON["exit_code"] == nil {
		t.Fatalf("the command failed:\n%s", r)
	}
	if e2e.Str(r.JSON, "stage_id") == "" {
		t.Fatalf("no stage committed:\n%s", r)
	}
	w := wsReport(t, r)
	perr, _ := w["patch_error"].(string)
	if !strings.Contains(perr, "2000") {
		t.Errorf("workspace.patch_error %q: want the cap of 2000 named", perr)
	}
	if w["patch_bytes"] != nil || w["changed"] != nil {
		t.Errorf("a refused patch reports patch_bytes %v, changed %v", w["patch_bytes"], w["changed"])
	}
	warned := false
	for _, wn := range r.JSON["warnings"].([]any) {
		if s, _ := wn.(string); strings.Contains(s, dest) {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning names the destination: %v", r.JSON["warnings"])
	}
	sameSnapshot(t, "the destination's directory", destBefore, snapshot(t, outDir))
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))

	// A fork of the stage has the run's other change and none of the
	// workspace.
	r = run(t, nil, "--no-network", "--stage", "ws/committed", "--",
		"sh", "-c", "cat /root/kept.txt; ls -A /workspace 2>/dev/null; true")
	if got := e2e.Str(r.JSON, "stdout"); got != "kept\n" {
		t.Errorf("a fork of the committed stage: got %q; want /root/kept.txt and an empty or missing /workspace", got)
	}
	if r.JSON["workspace"] != nil {
		t.Errorf("a run without --workspace reports %v", r.JSON["workspace"])
	}
}

func vmRecords(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(e2e.HomeDir, "vms"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
