package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/errdefs"

	"github.com/zeebo/blake3"
)

func TestHashLayerIDs(t *testing.T) {
	dir := t.TempDir()
	data := map[int64][]byte{4096: randBytes(1, 5000), 3 << 20: randBytes(2, 8192)}
	sparse := writeLayer(t, dir, "sparse", layerSpec{size: 8 << 20, chunks: data})
	dense := writeLayer(t, dir, "dense", layerSpec{size: 8 << 20, chunks: data, dense: true})
	other := writeLayer(t, dir, "other", layerSpec{size: 8 << 20, chunks: map[int64][]byte{4096: randBytes(3, 5000), 3 << 20: randBytes(2, 8192)}})
	longer := writeLayer(t, dir, "longer", layerSpec{size: 9 << 20, chunks: data})
	oneByte := writeLayer(t, dir, "onebyte", layerSpec{size: 8 << 20, chunks: map[int64][]byte{4096: randBytes(1, 5000), 3 << 20: randBytes(2, 8192), 7 << 20: {1}}})

	ds, as := diskUse(t, sparse), diskUse(t, dense)
	if ds >= as {
		t.Fatalf("test setup: sparse file allocates %d bytes, dense %d; the filesystem does not keep holes", ds, as)
	}
	id := func(path, parent, flavor string) string {
		t.Helper()
		got, _, err := hashLayer(context.Background(), path, parent, flavor)
		if err != nil {
			t.Fatal(err)
		}
		if !IDPattern.MatchString(got) {
			t.Fatalf("id %q is not st- and 16 hex digits", got)
		}
		return got
	}
	ref := id(sparse, "", testFlavor)
	tests := []struct {
		name   string
		path   string
		parent string
		flavor string
		same   bool
	}{
		{"same file again", sparse, "", testFlavor, true},
		{"dense copy of the same bytes", dense, "", testFlavor, true},
		{"different bytes", other, "", testFlavor, false},
		{"one more non-zero byte", oneByte, "", testFlavor, false},
		{"same data, longer file", longer, "", testFlavor, false},
		{"other parent", sparse, "st-0123456789abcdef", testFlavor, false},
		{"other flavor", sparse, "", "base-full", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := id(tc.path, tc.parent, tc.flavor); (got == ref) != tc.same {
				t.Errorf("id %s vs %s: same = %v, want %v", got, ref, got == ref, tc.same)
			}
		})
	}
}

func diskUse(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := allocatedBytes(f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCommitWritesStage(t *testing.T) {
	s := newStore(t)
	scratch := smallLayer(t, 7)
	before := time.Now()
	m, tm, err := s.Commit(context.Background(), req(scratch, "myproj/deps", ""))
	if err != nil {
		t.Fatal(err)
	}
	wantID, _, err := hashLayer(context.Background(), scratch, "", testFlavor)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != wantID {
		t.Errorf("ID = %s, want %s", m.ID, wantID)
	}
	if !regexp.MustCompile(`^[a-z]+-[a-z]+$`).MatchString(m.Name) || m.Name != baseName(m.ID) {
		t.Errorf("Name = %q, want adjective-noun %q", m.Name, baseName(m.ID))
	}
	if m.Label != "myproj/deps" || m.Parent != "" || !slices.Equal(m.Chain, []string{m.ID}) ||
		m.BaseFlavor != testFlavor || m.BaseSHA256 != testSHA || m.IsopodVersion != "test-1" ||
		!slices.Equal(m.Argv, []string{"sh", "-c", "make deps"}) {
		t.Errorf("meta = %+v", m)
	}
	if m.SizeBytes != 4<<20 || m.AllocatedBytes <= 0 || m.AllocatedBytes >= m.SizeBytes {
		t.Errorf("size %d allocated %d: want 4 MiB apparent, sparse allocation", m.SizeBytes, m.AllocatedBytes)
	}
	if m.Created.Before(before.Add(-time.Second)) || m.Created.After(time.Now()) || m.CreatedUnix != m.Created.Unix() {
		t.Errorf("created %v / %d not now", m.Created, m.CreatedUnix)
	}
	if tm.TotalMS < tm.HashMS+tm.CopyMS-1 {
		t.Errorf("timing %+v: total below its parts", tm)
	}

	// The layer is a byte-identical, sparse, read-only copy.
	src, err := os.ReadFile(scratch)
	if err != nil {
		t.Fatal(err)
	}
	layer := s.LayerPath(m.ID)
	dst, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Error("layer differs from the scratch file")
	}
	if got := diskUse(t, layer); got != m.AllocatedBytes || got > 64<<10 {
		t.Errorf("layer allocates %d bytes (meta says %d), want about the 16 KiB of data", got, m.AllocatedBytes)
	}
	if fi, err := os.Stat(layer); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("layer mode: %v %v, want 0444", fi.Mode(), err)
	}

	// meta.json holds the same meta; List shows the stage.
	b, err := os.ReadFile(filepath.Join(s.Dir(), m.ID, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk Meta
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"id"`, `"name"`, `"label"`, `"parent"`, `"chain"`, `"base_flavor"`, `"base_sha256"`,
		`"size_bytes"`, `"allocated_bytes"`, `"created"`, `"created_unix"`, `"argv"`, `"isopod_version"`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Errorf("meta.json lacks %s", key)
		}
	}
	if onDisk.ID != m.ID || onDisk.Name != m.Name || !onDisk.Created.Equal(m.Created) {
		t.Errorf("meta.json = %+v, want %+v", onDisk, m)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != m.ID {
		t.Errorf("List = %v, %v", list, err)
	}
	noTemps(t, s)
}

func TestCommitLabels(t *testing.T) {
	s := newStore(t)
	a := smallLayer(t, 1)
	first := mustCommit(t, s, req(a, "proj/deps", ""))

	t.Run("same content and label is idempotent", func(t *testing.T) {
		m, tm, err := s.Commit(context.Background(), req(a, "proj/deps", ""))
		if err != nil {
			t.Fatal(err)
		}
		if m.ID != first.ID || m.Name != first.Name || !m.Created.Equal(first.Created) || tm.CopyMS != 0 {
			t.Errorf("got %+v %+v, want the existing stage and no copy", m, tm)
		}
	})
	t.Run("label taken by other content", func(t *testing.T) {
		_, _, err := s.Commit(context.Background(), req(smallLayer(t, 2), "proj/deps", ""))
		wantErr(t, err, errdefs.ErrAlreadyExists, first.ID, first.Name, "proj/deps")
	})
	t.Run("same content under another label", func(t *testing.T) {
		_, _, err := s.Commit(context.Background(), req(a, "proj/other", ""))
		wantErr(t, err, errdefs.ErrAlreadyExists, first.ID, "proj/deps")
	})
	t.Run("label equal to a vanity name", func(t *testing.T) {
		_, _, err := s.Commit(context.Background(), req(smallLayer(t, 3), first.Name, ""))
		wantErr(t, err, errdefs.ErrAlreadyExists, first.ID)
	})
	t.Run("CheckCommit sees the taken label", func(t *testing.T) {
		wantErr(t, s.CheckCommit(req(a, "proj/deps", "")), errdefs.ErrAlreadyExists, first.ID)
		if err := s.CheckCommit(req(a, "proj/new", first.ID)); err != nil {
			t.Errorf("CheckCommit of a free label: %v", err)
		}
	})
	bad := []struct{ label, why string }{
		{"", "empty"},
		{"base", "reserved"},
		{"-rf", "'-'"},
		{strings.Repeat("x", 129), "limit is 128"},
		{"tab\there", "unprintable"},
		{"nl\n", "unprintable"},
		{" padded", "a space"},
		{"my deps", "a space"},
		{"st-mine", "stage ids"},
		{"nbsp\u00a0x", "unprintable"},
		{"st-0123456789abcdef", "stage id"},
		{"\xff\xfe", "UTF-8"},
	}
	for _, tc := range bad {
		t.Run("invalid "+tc.why, func(t *testing.T) {
			_, _, err := s.Commit(context.Background(), req(a, tc.label, ""))
			wantErr(t, err, errdefs.ErrInvalidArgument, tc.why)
		})
	}
	for _, ok := range []string{"x", "myproj/deps", strings.Repeat("y", 128), "émigré", "base2", "my_deps", "st", "rust/st-x", "a-b_c.d"} {
		if err := ValidateLabel(ok); err != nil {
			t.Errorf("ValidateLabel(%q) = %v, want ok", ok, err)
		}
	}
	noTemps(t, s)
}

func TestCommitRaceGoroutines(t *testing.T) {
	s := newStore(t)
	const n = 6
	scratches := make([]string, n)
	for i := range scratches {
		scratches[i] = smallLayer(t, uint64(100+i))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, _, errs[i] = s.Commit(context.Background(), req(scratches[i], "race", ""))
		}()
	}
	close(start)
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, errdefs.ErrAlreadyExists) && strings.Contains(err.Error(), `"race" is taken by stage st-`):
		default:
			t.Errorf("commit %d: %v", i, err)
		}
	}
	if wins != 1 {
		t.Errorf("%d commits won, want exactly 1", wins)
	}
	if list, err := s.List(); err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v; want one stage", list, err)
	}
	noTemps(t, s)
}

func TestCommitRaceProcesses(t *testing.T) {
	s := newStore(t)
	locks := filepath.Join(filepath.Dir(s.Dir()), "locks")
	goFile := filepath.Join(t.TempDir(), "go")
	const n = 4
	type proc struct {
		wait func() error
		out  func() string
	}
	var procs []proc
	for i := range n {
		cmd, out := startHelper(t, s, locks, smallLayer(t, uint64(200+i)), "shared/label", goFile, false)
		procs = append(procs, proc{cmd.Wait, out})
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wins, losses := 0, 0
	for i, p := range procs {
		if err := p.wait(); err != nil {
			t.Errorf("helper %d: %v: %s", i, err, p.out())
			continue
		}
		line := resultLine(p.out())
		switch {
		case strings.HasPrefix(line, "RESULT ok st-"):
			wins++
		case strings.HasPrefix(line, "RESULT err already_exists ") && strings.Contains(line, "is taken by stage st-"):
			losses++
		default:
			t.Errorf("helper %d said %q", i, p.out())
		}
	}
	if wins != 1 || losses != n-1 {
		t.Errorf("%d wins, %d losses; want 1 and %d", wins, losses, n-1)
	}
	if list, err := s.List(); err != nil || len(list) != 1 || list[0].Label != "shared/label" {
		t.Errorf("List = %v, %v; want one stage", list, err)
	}
	noTemps(t, s)
}

func resultLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "RESULT ") {
			return l
		}
	}
	return ""
}

func TestCommitChainDepth(t *testing.T) {
	s := newStore(t)
	parent := ""
	var last Meta
	for i := range MaxChainDepth {
		last = mustCommit(t, s, req(smallLayer(t, uint64(300+i)), "layer/"+string(rune('a'+i)), parent))
		if len(last.Chain) != i+1 || last.Parent != parent {
			t.Fatalf("layer %d: chain %v parent %q", i, last.Chain, last.Parent)
		}
		parent = last.ID
	}
	chain, err := s.Chain(last)
	if err != nil || len(chain) != MaxChainDepth || chain[0].Parent != "" || chain[9].ID != last.ID {
		t.Fatalf("Chain = %v, %v", chain, err)
	}
	r := req(smallLayer(t, 399), "layer/too-deep", last.ID)
	wantErr(t, s.CheckCommit(r), errdefs.ErrInvalidArgument, "limit is 10", "--stage base")
	_, _, err = s.Commit(context.Background(), r)
	wantErr(t, err, errdefs.ErrInvalidArgument, "chain of 11 layers", "limit is 10", "--stage base")
	noTemps(t, s)
}

func TestCommitBaseChecks(t *testing.T) {
	s := newStore(t)
	root := mustCommit(t, s, req(smallLayer(t, 1), "root", ""))

	r := req(smallLayer(t, 2), "child", root.ID)
	r.BaseFlavor = "base-full"
	r.AllowBaseSkew = true
	_, _, err := s.Commit(context.Background(), r)
	wantErr(t, err, errdefs.ErrInvalidArgument, "base-min", "base-full")

	r = req(smallLayer(t, 2), "child", root.ID)
	r.BaseSHA256 = otherSHA
	_, _, err = s.Commit(context.Background(), r)
	wantErr(t, err, errdefs.ErrFailedPrecondition, testSHA, otherSHA, "ISOPOD_ALLOW_BASE_SKEW=1")

	r.AllowBaseSkew = true
	m := mustCommit(t, s, r)
	if m.BaseSHA256 != otherSHA || !slices.Equal(m.Chain, []string{root.ID, m.ID}) {
		t.Errorf("skewed child: %+v", m)
	}

	_, _, err = s.Commit(context.Background(), req(smallLayer(t, 3), "orphan", "st-00000000000000ff"))
	wantErr(t, err, errdefs.ErrNotFound, "st-00000000000000ff")
	noTemps(t, s)
}

func TestCommitTimingLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and commits a 1 GiB sparse file; skipped in -short mode")
	}
	const size = 1 << 30
	chunks := map[int64][]byte{}
	for i := range 100 { // 100 MiB of data in 1 MiB extents, spread over the file
		chunks[int64(i)*(size/100)&^4095] = randBytes(uint64(i), 1<<20)
	}
	scratch := writeLayer(t, t.TempDir(), "big.ext4", layerSpec{size: size, chunks: chunks})
	s := newStore(t)
	m, tm, err := s.Commit(context.Background(), req(scratch, "big", ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1 GiB sparse layer, 100 MiB data: hash %d ms, copy %d ms, total %d ms; allocated %d MiB",
		tm.HashMS, tm.CopyMS, tm.TotalMS, m.AllocatedBytes>>20)
	if m.SizeBytes != size || m.AllocatedBytes < 100<<20 || m.AllocatedBytes > 110<<20 {
		t.Errorf("size %d allocated %d: want 1 GiB apparent, ~100 MiB allocated", m.SizeBytes, m.AllocatedBytes)
	}
	// The copy hashes to the same id: nothing was lost or added.
	id, _, err := hashLayer(context.Background(), s.LayerPath(m.ID), "", testFlavor)
	if err != nil || id != m.ID {
		t.Errorf("copy hashes to %s (%v), want %s", id, err, m.ID)
	}
}

// TestStageIDKnownAnswer pins the stage id to its documented encoding: a
// change of hash or encoding would give every existing stage another id.
func TestStageIDKnownAnswer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "layer")
	block := bytes.Repeat([]byte{0xa5}, blockSize)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4 * blockSize); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(block, blockSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, _, err := hashLayer(context.Background(), path, "st-0123456789abcdef", "base-min")
	if err != nil {
		t.Fatal(err)
	}
	// The encoding in hashLayer's comment, written out by hand.
	var enc []byte
	enc = append(enc, "isopod-stage-v1\x00st-0123456789abcdef\x00base-min\x00"...)
	enc = binary.LittleEndian.AppendUint64(enc, 4*blockSize)
	enc = binary.LittleEndian.AppendUint64(enc, blockSize)
	enc = append(enc, block...)
	sum := blake3.Sum256(enc)
	if want := "st-" + hex.EncodeToString(sum[:8]); got != want {
		t.Errorf("id %s; the documented encoding gives %s", got, want)
	}
	// And pinned, so that a change to both sides at once is noticed too.
	if got != "st-e05da460216f31fc" {
		t.Errorf("id %s; pinned st-e05da460216f31fc", got)
	}
}
