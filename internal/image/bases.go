package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

// Stored bases are the bases not built here: images imported from a
// registry, an OCI layout or a docker-save archive, and base builds pulled
// with a stage. They are kept by content id:
//
//	images/bases/<content id>/base.sqfs
//	images/bases/<content id>/base.json   BaseInfo (Kind, Name, Image)
//
// An imported base has a Name, the one runs give with --base. A pulled
// build whose name is taken here (another build of base-debian, another
// image imported under the same name) is kept by its content id only:
// the stages made over it find it by that id (see LookupBaseBuild).
const (
	storedDir     = "bases"
	storedSqfs    = "base.sqfs"
	storedSidecar = "base.json"
	storedLock    = "bases"

	// KindBuilt, KindImported: BaseInfo.Kind.
	KindBuilt    = "built"
	KindImported = "imported"
)

var (
	contentIDPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
	baseNamePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
)

// reservedNames are what an imported base may not be called.
var reservedNames = []string{FlavorBaseMin, FlavorBaseDebian, FlavorInitramfs, "base"}

// ValidBaseName checks the name of an imported base: 1 to 64 of a-z 0-9 .
// _ - starting with a letter or digit, not a built-in base's name and not
// shaped like a content id.
func ValidBaseName(name string) error {
	for _, r := range reservedNames {
		if name == r {
			return fmt.Errorf("base name %q is reserved (base-min and base-debian are built with `isopod image build`): choose another --name: %w",
				name, errdefs.ErrInvalidArgument)
		}
	}
	if !baseNamePattern.MatchString(name) || contentIDPattern.MatchString(name) {
		return fmt.Errorf("base name %q: use 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit: %w",
			name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ImportedContentID is the content id of an image imported by recipe
// from the manifest (or, for a docker-save archive, config) digest
// identity: the same image has the same id on every host, whatever
// mksquashfs packs it into.
func ImportedContentID(recipe int, identity string) string {
	sum := sha256.Sum256([]byte("isopod-imported-base\x00" + strconv.Itoa(recipe) + "\x00" + identity))
	return hex.EncodeToString(sum[:])
}

func storedRoot(p paths.Paths) string { return filepath.Join(p.Images(), storedDir) }

// StoredPath is where the stored base with content id id keeps its
// squashfs.
func StoredPath(p paths.Paths, id string) string {
	return filepath.Join(storedRoot(p), id, storedSqfs)
}

// readStored reads the stored base in dir; ok is false when it is not
// complete and consistent.
func readStored(dir string) (BaseInfo, bool) {
	var info BaseInfo
	if err := readJSON(filepath.Join(dir, storedSidecar), &info); err != nil {
		return BaseInfo{}, false
	}
	fi, err := os.Stat(filepath.Join(dir, storedSqfs))
	if err != nil || fi.Size() != info.Size || info.ContentSHA256 != filepath.Base(dir) {
		return BaseInfo{}, false
	}
	info.Path = filepath.Join(dir, storedSqfs)
	return info, true
}

// ListStored returns every complete stored base, by name then content id.
func ListStored(p paths.Paths) []BaseInfo {
	ents, _ := os.ReadDir(storedRoot(p))
	var out []BaseInfo
	for _, e := range ents {
		if !e.IsDir() || !contentIDPattern.MatchString(e.Name()) {
			continue
		}
		if info, ok := readStored(filepath.Join(storedRoot(p), e.Name())); ok {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ContentSHA256 < out[j].ContentSHA256
	})
	return out
}

// StoredByID returns the stored base with content id id.
func StoredByID(p paths.Paths, id string) (BaseInfo, bool) {
	if !contentIDPattern.MatchString(id) {
		return BaseInfo{}, false
	}
	return readStored(filepath.Join(storedRoot(p), id))
}

// storedByName returns the stored base runs know as name.
func storedByName(p paths.Paths, name string) (BaseInfo, bool) {
	for _, b := range ListStored(p) {
		if b.Name == name {
			return b, true
		}
	}
	return BaseInfo{}, false
}

// publishStored moves the finished base in dir (base.sqfs and a base.json
// for info) to its place, under the stored-bases lock. A name in info
// must be free (or already this base's); a base already stored under the
// same content id is kept, and given info's name if it has none.
func publishStored(p paths.Paths, dir string, info BaseInfo) (BaseInfo, error) {
	unlock, err := lock(p, storedLock)
	if err != nil {
		return BaseInfo{}, err
	}
	defer unlock()
	if err := checkNameFree(p, info.Name, info.ContentSHA256); err != nil {
		return BaseInfo{}, err
	}
	dst := filepath.Join(storedRoot(p), info.ContentSHA256)
	if old, ok := readStored(dst); ok {
		if old.Name == "" && info.Name != "" {
			old.Name = info.Name
			old.Path = ""
			if err := writeJSONAtomic(filepath.Join(dst, storedSidecar), old); err != nil {
				return BaseInfo{}, err
			}
		}
		old.Path, old.Cached = filepath.Join(dst, storedSqfs), true
		return old, nil
	}
	if err := os.MkdirAll(storedRoot(p), 0o755); err != nil {
		return BaseInfo{}, err
	}
	if err := writeJSONAtomic(filepath.Join(dir, storedSidecar), info); err != nil {
		return BaseInfo{}, err
	}
	if err := syncFile(filepath.Join(dir, storedSqfs)); err != nil {
		return BaseInfo{}, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return BaseInfo{}, err
	}
	os.RemoveAll(dst) // an incomplete leftover
	if err := os.Rename(dir, dst); err != nil {
		return BaseInfo{}, fmt.Errorf("publishing base %s: %w", info.ContentSHA256, err)
	}
	if err := syncDir(storedRoot(p)); err != nil {
		return BaseInfo{}, err
	}
	info.Path = filepath.Join(dst, storedSqfs)
	return info, nil
}

// checkNameFree refuses a name another stored base (another content id)
// is known by.
func checkNameFree(p paths.Paths, name, id string) error {
	if name == "" {
		return nil
	}
	for _, b := range ListStored(p) {
		if b.Name == name && b.ContentSHA256 != id {
			return fmt.Errorf("base %q is already imported from %s (content id %s): remove it with `isopod image rm %s` or choose another --name: %w",
				name, b.source(), b.ContentSHA256, name, errdefs.ErrAlreadyExists)
		}
		if b.Name != "" && b.Name != name && b.ContentSHA256 == id {
			return fmt.Errorf("this image is already imported as base %q (content id %s): use --base %s: %w",
				b.Name, id, b.Name, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// source says where a stored base came from.
func (b BaseInfo) source() string {
	switch {
	case b.Image != nil:
		return b.Image.Source
	case b.PulledFrom != "":
		return b.PulledFrom
	}
	return "this host"
}

// RemoveStored removes the stored base ref names (its name, its content
// id or a unique prefix of at least 12 digits of it). users says what
// still uses a base (stages, warm-pool snapshots); a base in use is
// refused with errdefs.ErrFailedPrecondition naming them.
func RemoveStored(p paths.Paths, ref string, users func(BaseInfo) []string) (BaseInfo, error) {
	for _, r := range []string{FlavorBaseMin, FlavorBaseDebian} {
		if ref == r {
			return BaseInfo{}, fmt.Errorf("%s is built here, not imported: `isopod image build %s` remakes it: %w", ref, ref, errdefs.ErrInvalidArgument)
		}
	}
	unlock, err := lock(p, storedLock)
	if err != nil {
		return BaseInfo{}, err
	}
	defer unlock()
	b, err := findStored(p, ref)
	if err != nil {
		return BaseInfo{}, err
	}
	if u := users(b); len(u) > 0 {
		return BaseInfo{}, fmt.Errorf("base %s (content id %s) is in use by %s; remove those first: %w",
			b.display(), b.ContentSHA256, strings.Join(u, ", "), errdefs.ErrFailedPrecondition)
	}
	dir := filepath.Dir(b.Path)
	doomed, err := os.MkdirTemp(p.Images(), ".tmp-rm-")
	if err != nil {
		return BaseInfo{}, err
	}
	if err := os.Rename(dir, filepath.Join(doomed, filepath.Base(dir))); err != nil {
		os.Remove(doomed)
		return BaseInfo{}, fmt.Errorf("removing base %s: %w", b.display(), err)
	}
	syncDir(storedRoot(p))
	os.RemoveAll(doomed)
	return b, nil
}

// display names a stored base for messages.
func (b BaseInfo) display() string {
	if b.Name != "" {
		return b.Name
	}
	return b.Flavor + " (pulled build)"
}

func findStored(p paths.Paths, ref string) (BaseInfo, error) {
	all := ListStored(p)
	for _, b := range all {
		if b.Name == ref || b.ContentSHA256 == ref {
			return b, nil
		}
	}
	var found []BaseInfo
	if len(ref) >= 12 && strings.Trim(ref, "0123456789abcdef") == "" {
		for _, b := range all {
			if strings.HasPrefix(b.ContentSHA256, ref) {
				found = append(found, b)
			}
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return BaseInfo{}, fmt.Errorf("no imported or pulled base is called %q (see `isopod image ls`): %w", ref, errdefs.ErrNotFound)
	}
	return BaseInfo{}, fmt.Errorf("%q is the prefix of %d content ids: give more of it: %w", ref, len(found), errdefs.ErrInvalidArgument)
}

// InstallPulled publishes a base pulled with a stage: dir holds its
// base.sqfs, whose sha256 the caller checked, and info is its record as
// the pushing host had it. An imported base takes its name here when the
// name is free; any other is kept by content id.
func InstallPulled(p paths.Paths, dir string, info BaseInfo, from string) (BaseInfo, error) {
	if !contentIDPattern.MatchString(info.ContentSHA256) {
		return BaseInfo{}, fmt.Errorf("pulled base: content id %q: %w", info.ContentSHA256, errdefs.ErrInvalidArgument)
	}
	info.Name, info.PulledFrom, info.Path, info.Cached = "", from, "", false
	if info.Kind == KindImported && ValidBaseName(info.Flavor) == nil {
		if _, taken := storedByName(p, info.Flavor); !taken {
			info.Name = info.Flavor
		}
	}
	b, err := publishStored(p, dir, info)
	if errors.Is(err, errdefs.ErrAlreadyExists) && info.Name != "" {
		info.Name = "" // lost a race for the name: keep it by id
		return publishStored(p, dir, info)
	}
	return b, err
}

// BaseRecord returns the record (Path set) of the build of base flavor
// with content id id: the base called flavor when it is that build, else
// the stored base with that id.
func BaseRecord(p paths.Paths, flavor, id string) (BaseInfo, error) {
	if knownBase(flavor) {
		var info BaseInfo
		bp := BasePath(p, flavor)
		if err := readJSON(sidecarPath(bp), &info); err == nil && info.ContentSHA256 == id {
			if fi, err := os.Stat(bp); err == nil && fi.Size() == info.Size {
				info.Path = bp
				return info, nil
			}
		}
	} else if b, ok := storedByName(p, flavor); ok && b.ContentSHA256 == id {
		return b, nil
	}
	if b, ok := StoredByID(p, id); ok {
		return b, nil
	}
	return BaseInfo{}, fmt.Errorf("base %s build %s is not on this host: %w", flavor, id, errdefs.ErrNotFound)
}
