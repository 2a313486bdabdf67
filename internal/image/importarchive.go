package image

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
)

// archiveLinkHops bounds the links followed to a docker-save archive's
// manifest.json or config.
const archiveLinkHops = 8

// checkArchive refuses a docker-save archive whose manifest.json or image
// configs go-containerregistry's tarball package, which reads them whole,
// should not read: over oci.MaxManifestBytes, links that do not end at a
// file, or missing. Only tar headers and manifest.json are read here,
// manifest.json through the cap.
func checkArchive(file string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("reading docker-save archive %s: "+format+": %w", append([]any{file}, append(a, errdefs.ErrInvalidArgument)...)...)
	}
	ents, err := archiveHeaders(file)
	if err != nil {
		return bad("%v", err)
	}
	mname, err := archiveTarget(ents, "manifest.json")
	if err != nil {
		return err
	}
	raw, err := archiveRead(file, mname, "manifest.json of "+file)
	if err != nil {
		return err
	}
	var manifest []struct{ Config string }
	if err := json.Unmarshal(raw, &manifest); err != nil {
		return bad("manifest.json: %v", err)
	}
	for _, m := range manifest {
		if _, err := archiveTarget(ents, m.Config); err != nil {
			return err
		}
	}
	return nil
}

// archiveHeaders lists an archive's entries by cleaned name, every header of a
// name in order (tar allows repeats).
func archiveHeaders(file string) (map[string][]*tar.Header, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents := map[string][]*tar.Header{}
	tr := tar.NewReader(f) // a file seeks over what it does not read
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return ents, nil
		}
		if err != nil {
			return nil, err
		}
		ents[path.Clean(h.Name)] = append(ents[path.Clean(h.Name)], h)
	}
}

// archiveTarget is the file name resolves to, the way the tarball package
// finds it (its first entry of that name, links followed), once every
// entry on the way is checked: at most the cap, and a file in the end.
func archiveTarget(ents map[string][]*tar.Header, name string) (string, error) {
	what, name := name, path.Clean(name)
	for range archiveLinkHops {
		hs := ents[name]
		if len(hs) == 0 {
			return "", fmt.Errorf("docker-save archive: %s has no entry %q: %w", what, name, errdefs.ErrInvalidArgument)
		}
		for _, h := range hs {
			if err := oci.CheckSize(h.Size, what+" in the archive"); err != nil {
				return "", err
			}
		}
		h := hs[0]
		switch h.Typeflag {
		case tar.TypeReg:
			return name, nil
		case tar.TypeSymlink, tar.TypeLink:
			name = path.Join(path.Dir(name), path.Clean(h.Linkname))
		default:
			return "", fmt.Errorf("docker-save archive: %s is not a file: %w", what, errdefs.ErrInvalidArgument)
		}
	}
	return "", fmt.Errorf("docker-save archive: %s is more than %d links deep: %w", what, archiveLinkHops, errdefs.ErrInvalidArgument)
}

// archiveRead reads the first entry called name, through the cap.
func archiveRead(file, name, what string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
		}
		if path.Clean(h.Name) == name {
			return oci.ReadCapped(tr, what)
		}
	}
}
