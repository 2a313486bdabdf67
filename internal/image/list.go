package image

import (
	"fmt"
	"os"
	"strings"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

// BaseFlavors are the base images isopod knows how to build.
var BaseFlavors = []string{FlavorBaseMin, FlavorBaseDebian}

// ImageInfo describes one buildable image as `isopod image ls` shows it.
type ImageInfo struct {
	Flavor          string `json:"flavor"` // initramfs, base-min, base-debian
	Built           bool   `json:"built"`
	Path            string `json:"path"`
	Size            int64  `json:"size,omitempty"`
	ContentSHA256   string `json:"content_sha256,omitempty"`
	ProtocolVersion int    `json:"protocol_version,omitempty"`
	BuiltUnix       int64  `json:"built_unix,omitempty"`
	// Stale: a base whose file disagrees with its record or that was made
	// by another build recipe, or an initramfs built for another protocol
	// version, holding another agent build or made for another kernel.
	// Rebuild it.
	Stale       bool   `json:"stale"`
	StaleReason string `json:"stale_reason,omitempty"`
	// Kind is "built" (base-min, base-debian), "imported" (a container
	// image, by name) or "pulled" (a build that came with a stage, kept by
	// content id).
	Kind   string `json:"kind,omitempty"`
	Source string `json:"source,omitempty"` // an imported base's source
	Digest string `json:"digest,omitempty"` // and its manifest digest

	// What a run over an imported base takes from its image.
	Env        []string `json:"-"`
	WorkingDir string   `json:"-"`
	NoShell    bool     `json:"-"`
}

// ListImages reports the initramfs of the current kernel and every base
// flavor, built or not. kernel and agentBin are the custom kernel and agent
// binary in use, if any (see ResolveKernel and LocateAgent).
func ListImages(paths paths.Paths, kernel, agentBin string) ([]ImageInfo, error) {
	out := []ImageInfo{initramfsStatus(paths, kernel, agentBin)}
	for _, f := range BaseFlavors {
		info, err := baseStatus(paths, f)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	for _, b := range ListStored(paths) {
		out = append(out, storedStatus(b))
	}
	return out, nil
}

func initramfsStatus(paths paths.Paths, kernel, agentBin string) ImageInfo {
	bk, kerr := ResolveKernel(paths, kernel)
	builtIn := kerr == nil && bk.BuiltIn
	p := InitramfsPath(paths, builtIn)
	ii := ImageInfo{Flavor: FlavorInitramfs, Path: p}
	var side InitramfsInfo
	if err := readJSON(sidecarPath(p), &side); err != nil {
		return ii
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ii
	}
	ii.Built, ii.Size, ii.ContentSHA256 = true, fi.Size(), side.ContentSHA256
	ii.ProtocolVersion, ii.BuiltUnix = side.ProtocolVersion, side.BuiltUnix
	var reasons []string
	if side.ProtocolVersion != agentproto.Version {
		reasons = append(reasons, fmt.Sprintf("protocol %d, isopod speaks %d", side.ProtocolVersion, agentproto.Version))
	}
	if agent, err := LocateAgent(agentBin); err == nil {
		if sum, err := sha256File(agent); err == nil && sum != side.AgentSHA256 {
			reasons = append(reasons, "agent binary "+agent+" changed since the build")
		}
	}
	if kerr == nil && !bk.BuiltIn && bk.Info.SHA256 != side.KernelSHA256 {
		reasons = append(reasons, "made for kernel "+side.KernelVersion+", current kernel is "+bk.Info.Version)
	}
	if len(reasons) > 0 {
		ii.Stale, ii.StaleReason = true, strings.Join(reasons, "; ")
	}
	return ii
}

func knownBase(flavor string) bool {
	for _, f := range BaseFlavors {
		if f == flavor {
			return true
		}
	}
	return false
}

func baseStatus(paths paths.Paths, flavor string) (ImageInfo, error) {
	if !knownBase(flavor) {
		return ImageInfo{}, fmt.Errorf("unknown base %q (known: %s): %w", flavor, strings.Join(BaseFlavors, ", "), errdefs.ErrInvalidArgument)
	}
	p := BasePath(paths, flavor)
	ii := ImageInfo{Flavor: flavor, Path: p, Kind: KindBuilt}
	var side BaseInfo
	if err := readJSON(sidecarPath(p), &side); err != nil {
		return ii, nil
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ii, nil
	}
	ii.Built, ii.Size, ii.ContentSHA256 = true, fi.Size(), side.ContentSHA256
	ii.ProtocolVersion, ii.BuiltUnix = side.ProtocolVersion, side.BuiltUnix
	// A base holds no part of isopod (the agent is in the initramfs), so
	// only a file that is not what its record says, or a record of another
	// way of making the base (see baseRecipes), makes it stale.
	switch {
	case fi.Size() != side.Size:
		ii.Stale, ii.StaleReason = true, fmt.Sprintf("image is %d bytes, its record says %d", fi.Size(), side.Size)
	case side.Recipe != baseRecipes[flavor]:
		ii.Stale, ii.StaleReason = true, fmt.Sprintf("made by build recipe %d, this isopod makes recipe %d", side.Recipe, baseRecipes[flavor])
	}
	return ii, nil
}

// LookupBase returns the base a run calls flavor: base-min, base-debian or
// an imported base's name. A base that is not built or is stale is refused
// with errdefs.ErrFailedPrecondition and the command that makes it.
func LookupBase(paths paths.Paths, flavor string) (ImageInfo, error) {
	if !knownBase(flavor) {
		return lookupStored(paths, flavor)
	}
	unlock, err := rlock(paths, flavor)
	if err != nil {
		return ImageInfo{}, err
	}
	defer unlock()
	ii, err := baseStatus(paths, flavor)
	if err != nil {
		return ImageInfo{}, err
	}
	if !ii.Built {
		return ImageInfo{}, fmt.Errorf("base %s is not built: run `isopod image build %s` (or `isopod image build-all`): %w", flavor, flavor, errdefs.ErrFailedPrecondition)
	}
	if ii.Stale {
		return ImageInfo{}, fmt.Errorf("base %s is stale (%s): run `isopod image build %s`; stages made over the old build "+
			"are then refused as made over another base build until they are rebuilt: %w", flavor, ii.StaleReason, flavor, errdefs.ErrFailedPrecondition)
	}
	return ii, nil
}

// storedStatus describes a stored base as `isopod image ls` shows it.
func storedStatus(b BaseInfo) ImageInfo {
	ii := ImageInfo{
		Flavor: b.Name, Built: true, Path: b.Path, Size: b.Size, ContentSHA256: b.ContentSHA256,
		ProtocolVersion: b.ProtocolVersion, BuiltUnix: b.BuiltUnix, Kind: KindImported,
	}
	if b.Name == "" {
		ii.Flavor, ii.Kind = b.Flavor, "pulled"
	}
	if im := b.Image; im != nil {
		ii.Source, ii.Digest = im.Source, im.Digest
		ii.Env, ii.WorkingDir, ii.NoShell = im.Env, im.WorkingDir, !im.Shell
	}
	if b.Name != "" && b.Kind == KindImported && b.Recipe != ImportRecipe {
		ii.Stale, ii.StaleReason = true, fmt.Sprintf("imported by recipe %d, this isopod imports with recipe %d: import it again", b.Recipe, ImportRecipe)
	}
	return ii
}

// lookupStored is LookupBase for an imported base's name.
func lookupStored(paths paths.Paths, name string) (ImageInfo, error) {
	b, ok := storedByName(paths, name)
	if !ok {
		known := append([]string(nil), BaseFlavors...)
		for _, s := range ListStored(paths) {
			if s.Name != "" {
				known = append(known, s.Name)
			}
		}
		return ImageInfo{}, fmt.Errorf("unknown base %q (known: %s; `isopod image import` makes more): %w",
			name, strings.Join(known, ", "), errdefs.ErrInvalidArgument)
	}
	ii := storedStatus(b)
	if ii.Stale {
		return ImageInfo{}, fmt.Errorf("base %s is stale (%s): %w", name, ii.StaleReason, errdefs.ErrFailedPrecondition)
	}
	return ii, nil
}

// LookupBaseBuild returns the stored base with content id id: what a
// stage made over that build boots when the base called by its flavor
// here is another build.
func LookupBaseBuild(paths paths.Paths, id string) (ImageInfo, bool) {
	b, ok := StoredByID(paths, id)
	if !ok {
		return ImageInfo{}, false
	}
	ii := storedStatus(b)
	ii.Stale, ii.StaleReason = false, ""
	return ii, true
}
