package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQEMU writes a script that answers the three help questions and
// counts its runs in a file beside it.
func fakeQEMU(t *testing.T) (bin string, runs func() int) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, "qemu-system-x86_64")
	count := filepath.Join(dir, "runs")
	script := "#!/bin/sh\necho x >> " + count + "\n" +
		"case \"$2\" in help) echo /usr/share/qemu ;; microvm,help) echo 'microvm-machine options:'; echo '  rtc=<OnOffAuto>' ;; *) echo '  readonly=<bool>' ;; esac\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "x")
	}
}

func TestFactsCacheHelp(t *testing.T) {
	bin, runs := fakeQEMU(t)
	c := factsCache{path: filepath.Join(t.TempDir(), "facts.json")}
	ctx := context.Background()
	first, err := probeMachine(ctx, c, bin)
	if err != nil {
		t.Fatal(err)
	}
	if runs() != 3 {
		t.Fatalf("%d runs of the binary for the first probe; want 3", runs())
	}
	second, err := probeMachine(ctx, c, bin)
	if err != nil {
		t.Fatal(err)
	}
	if runs() != 3 {
		t.Errorf("%d runs after a second probe; want 3 (cached)", runs())
	}
	if !second.Microvm["rtc"] || !second.Backend["readonly"] || len(second.SearchPath) != len(first.SearchPath) {
		t.Errorf("cached facts %+v differ from asked %+v", second, first)
	}
	// A changed binary is asked again.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(bin, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := probeMachine(ctx, c, bin); err != nil {
		t.Fatal(err)
	}
	if runs() != 6 {
		t.Errorf("%d runs after the binary changed; want 6", runs())
	}
	// A cache file that is not JSON only means asking again.
	if err := os.WriteFile(c.path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := probeMachine(ctx, c, bin); err != nil {
		t.Fatal(err)
	}
	if runs() != 9 {
		t.Errorf("%d runs after the cache was spoiled; want 9", runs())
	}
}

func TestFactsCacheLibraries(t *testing.T) {
	bin, _ := fakeQEMU(t)
	lib := filepath.Join(t.TempDir(), "libfake.so.1")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := factsCache{path: filepath.Join(t.TempDir(), "facts.json")}
	calls := 0
	list := func(string) ([]string, error) { calls++; return []string{lib}, nil }
	for i := 0; i < 2; i++ {
		got, err := c.cachedLibraries(bin, list)
		if err != nil || len(got) != 1 || got[0] != lib {
			t.Fatalf("libraries %v, %v; want [%s]", got, err, lib)
		}
	}
	if calls != 1 {
		t.Errorf("listed %d times; want 1 (cached)", calls)
	}
	// The help texts and the libraries share the record.
	if _, err := probeMachine(context.Background(), c, bin); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cachedLibraries(bin, list); err != nil || calls != 1 {
		t.Errorf("listed %d times after the help was cached; want 1", calls)
	}
	// A library that is gone is listed again.
	os.Remove(lib)
	c.cachedLibraries(bin, list)
	if calls != 2 {
		t.Errorf("listed %d times after a library went away; want 2", calls)
	}
	// A cached list that is not what ldd gives (a directory, a relative
	// path) is not taken.
	for _, bad := range []string{t.TempDir(), "libfake.so.1"} {
		key, _ := factsKey(bin)
		c.store(factsRecord{Key: key, Libraries: []string{bad}})
		before := calls
		if got, _ := c.cachedLibraries(bin, list); calls != before+1 || len(got) != 1 || got[0] == bad {
			t.Errorf("cached %q taken: %v", bad, got)
		}
	}
}
