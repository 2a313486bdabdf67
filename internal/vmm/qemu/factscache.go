package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// What a QEMU binary says of itself (its help texts) and the libraries it
// loads are the same for every call until the binary or the loader's cache
// changes, yet asking costs three QEMU starts and an ldd on every isopod
// process (about 40 ms of a CLI run's wall time, and more CPU). The facts
// cache (Config.FactsCache) keeps them across processes, keyed by what
// they depend on; a key that no longer matches, a file that cannot be read
// or a listed library that is gone only means asking again.

// factsRecord is one binary's cached facts.
type factsRecord struct {
	Key string `json:"key"`
	// The help texts probeMachine parses.
	LHelp       string `json:"l_help"`
	MicrovmHelp string `json:"microvm_help"`
	BackendHelp string `json:"backend_help"`
	// Libraries is jail.Libraries' list; empty until a jailed driver
	// asked.
	Libraries []string `json:"libraries,omitempty"`
}

// factsKey names what bin's facts depend on: the binary itself (its
// identity and times) and the loader's cache, which decides where its
// libraries resolve.
func factsKey(bin string) (string, error) {
	key := ""
	for _, f := range []string{bin, "/etc/ld.so.cache"} {
		var st syscall.Stat_t
		if err := syscall.Stat(f, &st); err != nil {
			if f != bin {
				continue
			}
			return "", err
		}
		key += fmt.Sprintf("%s:%d:%d:%d:%d.%d:%d.%d|", f, st.Dev, st.Ino, st.Size,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return key, nil
}

// factsCache reads and writes one cache file; the zero value (no file)
// caches nothing.
type factsCache struct{ path string }

// load returns the record for key, if the file holds it.
func (c factsCache) load(key string) (factsRecord, bool) {
	var rec factsRecord
	if !readCache(c.path, &rec) || rec.Key != key {
		return factsRecord{}, false
	}
	return rec, true
}

// store publishes rec; a failure only costs asking again.
func (c factsCache) store(rec factsRecord) { writeCache(c.path, rec) }

// readCache reads the JSON cache file path ("" for none) into v and
// reports whether it could.
func readCache(path string, v any) bool {
	if path == "" {
		return false
	}
	b, err := os.ReadFile(path)
	return err == nil && json.Unmarshal(b, v) == nil
}

// writeCache publishes v as the JSON cache file path ("" for none) by
// rename, so that readers see a whole file; a failure leaves the old one.
func writeCache(path string, v any) {
	if path == "" {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}

// cachedHelp returns bin's help texts, from the cache when it holds them
// for bin as it is now, else by asking bin (and caching the answer).
func (c factsCache) cachedHelp(ctx context.Context, bin string) (helpTexts, error) {
	key, kerr := factsKey(bin)
	if kerr == nil {
		if rec, ok := c.load(key); ok && rec.LHelp != "" {
			return helpTexts{L: rec.LHelp, Microvm: rec.MicrovmHelp, Backend: rec.BackendHelp}, nil
		}
	}
	h, err := askHelp(ctx, bin)
	if err != nil || kerr != nil {
		return h, err
	}
	rec, _ := c.load(key)
	rec.Key, rec.LHelp, rec.MicrovmHelp, rec.BackendHelp = key, h.L, h.Microvm, h.Backend
	c.store(rec)
	return h, nil
}

// cachedLibraries returns what list says bin loads, from the cache when it
// holds it for bin as it is now and every library listed is still there.
func (c factsCache) cachedLibraries(bin string, list func(string) ([]string, error)) ([]string, error) {
	key, kerr := factsKey(bin)
	if kerr == nil {
		if rec, ok := c.load(key); ok && len(rec.Libraries) > 0 && allExist(rec.Libraries) {
			return rec.Libraries, nil
		}
	}
	libs, err := list(bin)
	if err != nil || kerr != nil {
		return libs, err
	}
	rec, _ := c.load(key)
	rec.Key, rec.Libraries = key, libs
	c.store(rec)
	return libs, nil
}

// allExist reports whether every path is absolute and names a regular
// file (a cached list the jail would bind is taken only as ldd would give
// it).
func allExist(paths []string) bool {
	for _, p := range paths {
		if st, err := os.Stat(p); !filepath.IsAbs(p) || err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}
