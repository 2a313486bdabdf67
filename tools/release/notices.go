package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// module is one Go module linked into a binary.
type module struct{ Path, Version string }

// licenceFileRE matches the files at a module's root that carry its licence
// or notices.
var licenceFileRE = regexp.MustCompile(`(?i)^(licen[cs]e|copying|notice|patents)([.-].*)?$`)

// goNotices collects the licence and notice files of the Go standard
// library and of every module linked into bins (read from their build
// information), from the module cache through `go mod download`.
func goNotices(ctx context.Context, bins []string) ([]byte, error) {
	mods := map[module]bool{}
	goVersion := ""
	for _, b := range bins {
		bi, err := buildinfo.ReadFile(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b, err)
		}
		goVersion = bi.GoVersion
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			if d.Version == "" || d.Version == "(devel)" {
				return nil, fmt.Errorf("%s links %s with no version (a local replace?); a release links only published modules", b, d.Path)
			}
			mods[module{d.Path, d.Version}] = true
		}
	}
	list := make([]module, 0, len(mods))
	for m := range mods {
		list = append(list, m)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Path != list[j].Path {
			return list[i].Path < list[j].Path
		}
		return list[i].Version < list[j].Version
	})
	var out bytes.Buffer
	out.WriteString("isopod's binaries contain the Go standard library and the Go modules below.\n")
	out.WriteString("Each one's licence and notice files follow, as published with it.\n")
	goroot, err := goEnv(ctx, "GOROOT")
	if err != nil {
		return nil, err
	}
	if err := appendLicences(&out, "Go standard library "+goVersion, goroot); err != nil {
		return nil, err
	}
	for _, m := range list {
		dir, err := moduleDir(ctx, m)
		if err != nil {
			return nil, err
		}
		if err := appendLicences(&out, m.Path+" "+m.Version, dir); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

// appendLicences appends the licence files at dir's root, in name order,
// under a heading; a module without one is an error.
func appendLicences(out *bytes.Buffer, what, dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	found := 0
	for _, e := range ents {
		if !e.Type().IsRegular() || !licenceFileRE.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\n%s\n%s: %s\n%s\n\n", strings.Repeat("=", 72), what, e.Name(), strings.Repeat("=", 72))
		out.Write(bytes.TrimRight(b, "\n"))
		out.WriteString("\n")
		found++
	}
	if found == 0 {
		return fmt.Errorf("%s: no licence file in %s", what, dir)
	}
	return nil
}

// moduleDir is where the module cache holds m (downloading it if needed).
func moduleDir(ctx context.Context, m module) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", m.Path+"@"+m.Version)
	cmd.Dir = os.TempDir() // outside any module
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", m.Path, m.Version, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var res struct{ Dir, Error string }
	if err := json.Unmarshal(b, &res); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", m.Path, m.Version, err)
	}
	if res.Error != "" || res.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", m.Path, m.Version, res.Error)
	}
	return res.Dir, nil
}

func goEnv(ctx context.Context, name string) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}
