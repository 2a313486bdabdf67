package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"isopod/internal/paths"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/gofrs/flock"
)

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// lock takes the exclusive lock locks/<name>.lock and returns its release.
func lock(paths paths.Paths, name string) (func(), error) {
	return takeLock(paths, name, false)
}

// rlock takes the shared lock locks/<name>.lock.
func rlock(paths paths.Paths, name string) (func(), error) {
	return takeLock(paths, name, true)
}

func takeLock(paths paths.Paths, name string, shared bool) (func(), error) {
	if err := os.MkdirAll(paths.Locks(), 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory: %w", err)
	}
	fl := flock.New(filepath.Join(paths.Locks(), name+".lock"))
	var err error
	if shared {
		err = fl.RLock()
	} else {
		err = fl.Lock()
	}
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", fl.Path(), err)
	}
	return func() { fl.Unlock() }, nil
}

// sha256File returns the hex sha256 of the file at path.
func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func sha256Bytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// syncDir fsyncs a directory so that renames into it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// syncTree fsyncs every regular file and directory under root.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Type().IsRegular() {
			return syncFile(p)
		}
		return nil
	})
}

// writeFileAtomic writes data to a temporary file next to path, syncs it and
// renames it over path.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return fmt.Errorf("creating temporary file: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("publishing %s: %w", path, err)
	}
	ok = true
	return syncDir(dir)
}

// writeJSONAtomic writes v as indented JSON to path atomically.
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", filepath.Base(path), err)
	}
	return writeFileAtomic(path, append(b, '\n'), 0o644)
}

// readJSON decodes the JSON file at path into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	return nil
}

// publishFile syncs the finished file tmp and renames it to dst.
func publishFile(tmp, dst string) error {
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("publishing %s: %w", dst, err)
	}
	return syncDir(filepath.Dir(dst))
}
