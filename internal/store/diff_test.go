package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// summary renders a diff as sorted "kind path type size old" lines.
func summary(d DiffResult) string {
	var b strings.Builder
	for _, l := range []struct {
		kind string
		es   []Entry
	}{{"A", d.Added}, {"C", d.Changed}, {"R", d.Removed}} {
		for _, e := range l.es {
			typ := e.Type
			if e.OldType != "" {
				typ = e.OldType + ">" + e.Type
			}
			fmt.Fprintf(&b, "%s %s %s %d %d\n", l.kind, e.Path, typ, e.Size, e.OldSize)
		}
	}
	return b.String()
}

func TestDiff(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	ctx := context.Background()
	weird := "we ird\nname/x" // a name with a space, a newline and a slash-free tail

	l1 := mkExt4(t, []treeFile{
		{path: "keep.txt", data: "same"},
		{path: "change.txt", data: "v1"},
		{path: "gone.txt", data: "bye"},
		{path: "dir/a", data: "a"},
		{path: "dir/b", data: "bb"},
		{path: "samesize.txt", data: "aaaa"},
		{path: "mode.sh", data: "echo"},
		{path: "link", kind: "symlink", data: "keep.txt"},
		{path: "longlink", kind: "symlink", data: strings.Repeat("t", 100)},
		{path: "deep/er/still/file", data: "deep"},
		{path: "became-dir", data: "file"},
		{path: "rewritten.txt", data: "same bytes"},
	})
	l2 := mkExt4(t, []treeFile{
		{path: "change.txt", data: "v2-longer"},
		{path: "gone.txt", kind: "whiteout"},
		{path: "dir", kind: "opaque"},
		{path: "dir/c", data: "ccc"},
		{path: "new.txt", data: "new!"},
		{path: "samesize.txt", data: "bbbb"},
		{path: "mode.sh", data: "echo", mode: 0o755},
		{path: "link", kind: "symlink", data: "new.txt"},
		{path: "longlink", kind: "symlink", data: strings.Repeat("u", 100)},
		{path: strings.Split(weird, "/")[0], kind: "dir"},
		{path: weird, data: "odd"},
		{path: "became-dir/inside", data: "in"},
		{path: "rewritten.txt", data: "same bytes"},
	})
	m1 := mustCommit(t, s, req(l1, "diff/one", ""))
	m2 := mustCommit(t, s, req(l2, "diff/two", m1.ID))

	l3 := mkExt4(t, []treeFile{
		{path: "gone.txt", data: "back"},
		{path: "dir", kind: "whiteout"},
		{path: "deep/er", kind: "opaque"},
	})
	m3 := mustCommit(t, s, req(l3, "diff/three", m2.ID))

	tests := []struct {
		name, a, b, want string
	}{
		{"layer over its parent", "diff/one", "diff/two", `
A /new.txt file 4 0
A /we ird
name dir 0 0
A /we ird
name/x file 3 0
C /became-dir file>dir 0 4
C /change.txt file 9 2
C /link symlink 7 8
C /longlink symlink 100 100
C /mode.sh file 4 4
C /samesize.txt file 4 4
A /became-dir/inside file 2 0
A /dir/c file 3 0
R /dir/a file 0 1
R /dir/b file 0 2
R /gone.txt file 0 3
`},
		{"third layer: re-add, whiteout a dir, opaque subtree", "diff/two", "diff/three", `
A /gone.txt file 4 0
R /deep/er/still dir 0 0
R /deep/er/still/file file 0 4
R /dir dir 0 0
R /dir/c file 0 3
`},
		{"base to a 2-layer chain", "base", "diff/two", `
A /became-dir dir 0 0
A /became-dir/inside file 2 0
A /change.txt file 9 0
A /deep dir 0 0
A /deep/er dir 0 0
A /deep/er/still dir 0 0
A /deep/er/still/file file 4 0
A /dir dir 0 0
A /dir/c file 3 0
A /keep.txt file 4 0
A /link symlink 7 0
A /longlink symlink 100 0
A /mode.sh file 4 0
A /new.txt file 4 0
A /rewritten.txt file 10 0
A /samesize.txt file 4 0
A /we ird
name dir 0 0
A /we ird
name/x file 3 0
`},
		{"same stage", "diff/two", m2.ID, ""},
		{"backwards", "diff/three", "diff/two", `
A /deep/er/still dir 0 0
A /deep/er/still/file file 4 0
A /dir dir 0 0
A /dir/c file 3 0
R /gone.txt file 0 4
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := s.Diff(ctx, tc.a, tc.b)
			if err != nil {
				t.Fatal(err)
			}
			got := summary(d)
			if want := sortLines(strings.TrimPrefix(tc.want, "\n")); sortLines(got) != want {
				t.Errorf("Diff(%s, %s):\n%s\nwant:\n%s", tc.a, tc.b, got, want)
			}
		})
	}
	if d, err := s.Diff(ctx, m3.Name, "diff/thr"); err != nil || summary(d) != "" {
		t.Errorf("Diff by name and prefix of one stage = %q, %v; want empty", summary(d), err)
	}
	_, err := s.Diff(ctx, "diff/", "diff/two")
	wantErr(t, err, errdefs.ErrInvalidArgument, "ambiguous")
}

func TestDiffLargeTree(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	var one, two []treeFile
	for d := range 40 {
		for f := range 100 {
			p := fmt.Sprintf("lib/pkg%02d/sub/mod%03d.js", d, f)
			one = append(one, treeFile{path: p, data: strings.Repeat("x", f)})
			if f%20 == 0 { // same size, new content
				two = append(two, treeFile{path: p, data: strings.Repeat("y", f)})
			}
		}
	}
	m1 := mustCommit(t, s, req(mkExt4(t, one), "big/one", ""))
	m2 := mustCommit(t, s, req(mkExt4(t, two), "big/two", m1.ID))
	start := time.Now()
	d, err := s.Diff(context.Background(), m1.ID, m2.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("diff of a 4000-file layer and a 200-file layer over it: %v", time.Since(start))
	// f == 0 files are empty in both: not changed.
	if len(d.Added) != 0 || len(d.Removed) != 0 || len(d.Changed) != 160 {
		t.Errorf("got %d added, %d changed, %d removed; want 0, 160, 0", len(d.Added), len(d.Changed), len(d.Removed))
	}
}

// sortLines sorts the entries of a summary, keeping multi-line names (an
// entry continues on lines that do not start with "A ", "C " or "R ")
// together.
func sortLines(s string) string {
	var entries []string
	for _, l := range strings.SplitAfter(s, "\n") {
		if l == "" {
			continue
		}
		if len(entries) > 0 && !(strings.HasPrefix(l, "A /") || strings.HasPrefix(l, "C /") || strings.HasPrefix(l, "R /")) {
			entries[len(entries)-1] += l
			continue
		}
		entries = append(entries, l)
	}
	for i := range entries {
		for j := i + 1; j < len(entries); j++ {
			if entries[j] < entries[i] {
				entries[i], entries[j] = entries[j], entries[i]
			}
		}
	}
	return strings.Join(entries, "")
}

func TestParseLsP(t *testing.T) {
	sec := []byte("/12/040755/0/0/.//\n/2/040755/0/0/..//\n/13/100644/1000/100/a b/6/\n" +
		"/14/040700/0/0/d//\n/15/100600/0/0/new\nline/0/\n/19/020000/0/0/wh/0/\n\n")
	got, err := parseLsP(sec)
	if err != nil {
		t.Fatal(err)
	}
	want := []dirent{
		{ino: 13, mode: 0o100644, uid: 1000, gid: 100, name: "a b", size: 6},
		{ino: 14, mode: 0o040700, name: "d"},
		{ino: 15, mode: 0o100600, name: "new\nline"},
		{ino: 19, mode: 0o020000, name: "wh"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseLsP = %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"/12/040755/0/0/trunc", "junk\n", "/x/040755/0/0/a//\n"} {
		if _, err := parseLsP([]byte(bad)); err == nil {
			t.Errorf("parseLsP(%q) accepted bad input", bad)
		}
	}
}
