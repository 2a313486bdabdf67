package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// writeSums writes SHA256SUMS over the artifacts, in the format
// `sha256sum -c` reads, sorted by name.
func writeSums(dst string, arts []string) error {
	names := append([]string(nil), arts...)
	sort.Slice(names, func(i, j int) bool { return filepath.Base(names[i]) < filepath.Base(names[j]) })
	var b strings.Builder
	for _, a := range names {
		sum, err := sha256File(a)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, filepath.Base(a))
	}
	return writeAtomic(dst, func(f *os.File) error {
		_, err := f.WriteString(b.String())
		return err
	})
}

func sha256File(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
