package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
)

// afterCopyHook, when set (by tests only), runs between the layer copy and
// the publishing step, so a test can interrupt a commit there.
var afterCopyHook func()

// MaxLabelBytes is the longest label accepted.
const MaxLabelBytes = 128

// CommitRequest asks to publish a run's scratch layer as a stage.
type CommitRequest struct {
	Scratch    string // path of the scratch ext4 (not modified)
	Label      string // unique label; see ValidateLabel
	Parent     string // parent stage id, or "" over the base image
	BaseFlavor string // base image flavor the run used
	BaseSHA256 string // content id of the installed base build ("" if unknown)
	Argv       []string
	// AllowBaseSkew lets a stage be stacked on a chain made over another
	// build of the same base flavor.
	AllowBaseSkew bool
}

// CommitTiming reports where a commit's time went, in milliseconds.
type CommitTiming struct {
	HashMS  int64 `json:"hash_ms"`
	CopyMS  int64 `json:"copy_ms"` // 0 when the stage already existed
	TotalMS int64 `json:"total_ms"`
}

// A LabelError is a label the rule refuses. It wraps
// errdefs.ErrInvalidArgument; Reason says what is wrong and the fix, for a
// front end that names the label's argument its own way.
type LabelError struct {
	Label  string
	Reason string
}

func (e *LabelError) Error() string { return fmt.Sprintf("label %q %s", e.Label, e.Reason) }

func (e *LabelError) Unwrap() error { return errdefs.ErrInvalidArgument }

// ValidateLabel is the one rule for a new stage label, whoever names it
// (run --commit-as, stage pull --as, a received stage): non-empty, at most
// MaxLabelBytes bytes of printable UTF-8 without spaces, not starting with
// '-' or IDPrefix, and not "base". '/' is allowed ("myproj/deps"). It
// refuses only new labels: Resolve finds a stored stage by any label it
// has. A refusal is a *LabelError.
func ValidateLabel(label string) error {
	bad := func(why string) error { return &LabelError{Label: label, Reason: why} }
	switch {
	case label == "":
		return bad("is empty; give one like myproj/deps")
	case len(label) > MaxLabelBytes:
		return bad(fmt.Sprintf("is %d bytes; the limit is %d", len(label), MaxLabelBytes))
	case !utf8.ValidString(label):
		return bad("is not valid UTF-8")
	case strings.HasPrefix(label, "-"):
		return bad("starts with '-'; labels must not look like flags")
	case label == BaseRef:
		return bad("is reserved for the empty stage; choose another")
	case strings.HasPrefix(label, IDPrefix):
		return bad("starts with " + IDPrefix + " and would shadow stage ids; choose a name")
	}
	for _, r := range label {
		switch {
		case r == ' ':
			return bad("contains a space; use '-', '_' or '/' instead, as in myproj/deps")
		case !unicode.IsPrint(r):
			return bad(fmt.Sprintf("contains the unprintable character %U; labels are printable, without spaces", r))
		}
	}
	return nil
}

// CheckCommit checks, without hashing or copying anything, that req could
// be committed now: the label is valid and free, the parent exists, the new
// chain stays within MaxChainDepth and agrees with the parent chain's base
// flavor and build (see CheckBase). Front ends call it before booting a run
// that will commit; Commit repeats it.
func (s *Store) CheckCommit(req CommitRequest) error {
	_, err := s.checkCommit(req)
	if err != nil {
		return err
	}
	all, err := s.List()
	if err != nil {
		return err
	}
	return labelFree(all, req.Label, "")
}

// checkCommit validates req and returns the parent's chain.
func (s *Store) checkCommit(req CommitRequest) ([]Meta, error) {
	if err := ValidateLabel(req.Label); err != nil {
		return nil, err
	}
	if req.Scratch == "" {
		return nil, fmt.Errorf("commit: no scratch layer given: %w", errdefs.ErrInvalidArgument)
	}
	if req.BaseFlavor == "" {
		return nil, fmt.Errorf("commit: no base flavor given: %w", errdefs.ErrInvalidArgument)
	}
	if req.Parent == "" {
		return nil, nil
	}
	parent, err := s.Get(req.Parent)
	if err != nil {
		return nil, fmt.Errorf("commit parent: %w", err)
	}
	chain, err := s.Chain(parent)
	if err != nil {
		return nil, err
	}
	if len(chain)+1 > MaxChainDepth {
		return nil, fmt.Errorf("committing over %s would make a chain of %d layers; the limit is %d: "+
			"flatten it by re-running the setup from a fresh `--stage %s` run and committing that: %w",
			parent, len(chain)+1, MaxChainDepth, BaseRef, errdefs.ErrInvalidArgument)
	}
	warns, err := CheckBase(chain, req.BaseFlavor, req.BaseSHA256, req.AllowBaseSkew)
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		s.log.Warn(w)
	}
	return chain, nil
}

// labelFree checks that label is used by no stage other than selfID, as a
// label or as a vanity name.
func labelFree(all []Meta, label, selfID string) error {
	for _, m := range all {
		if m.ID == selfID {
			continue
		}
		if m.Label == label {
			return fmt.Errorf("label %q is taken by stage %s (%s); pick another label or remove it with `isopod stage rm %s`: %w",
				label, m.ID, m.Name, m.ID, errdefs.ErrAlreadyExists)
		}
		if m.Name == label {
			return fmt.Errorf("label %q is the name of stage %s (label %q); pick another label: %w",
				label, m.ID, m.Label, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// decide checks, under the store lock, whether a stage with id and label
// may be published. It returns the existing stage when the same content was
// already committed under the same label.
func decide(all []Meta, id, label string) (existing *Meta, err error) {
	for i := range all {
		m := all[i]
		if m.ID != id {
			continue
		}
		if m.Label == label {
			return &all[i], nil
		}
		return nil, fmt.Errorf("identical content is already stage %s (%s) with label %q; fork it with `--stage %s` instead of committing it again: %w",
			m.ID, m.Name, m.Label, m.Label, errdefs.ErrAlreadyExists)
	}
	return nil, labelFree(all, label, id)
}

// Commit publishes the scratch layer req.Scratch as an immutable stage and
// returns its meta. The id derives from the layer's content, its parent and
// its base flavor; committing the same content with the same label again
// returns the existing stage. A label used by another stage, or the same
// content under another label, is refused with errdefs.ErrAlreadyExists.
//
// The layer is copied sparsely into a temporary directory inside the store,
// fsynced and published by rename under the store lock: an interrupted
// commit leaves only a temporary directory that List ignores and GC removes.
func (s *Store) Commit(ctx context.Context, req CommitRequest) (Meta, CommitTiming, error) {
	return s.commit(ctx, req, false)
}

// commit is Commit; adopt moves req.Scratch, a file in the store, into the
// stage instead of copying it.
func (s *Store) commit(ctx context.Context, req CommitRequest, adopt bool) (Meta, CommitTiming, error) {
	start := time.Now()
	var tm CommitTiming
	if _, err := s.checkCommit(req); err != nil {
		return Meta{}, tm, err
	}
	t0 := time.Now()
	id, digest, size, err := HashLayer(ctx, req.Scratch, req.Parent, req.BaseFlavor)
	if err != nil {
		return Meta{}, tm, err
	}
	tm.HashMS = time.Since(t0).Milliseconds()
	done := func(m Meta, err error) (Meta, CommitTiming, error) {
		tm.TotalMS = time.Since(start).Milliseconds()
		return m, tm, err
	}

	// Fail fast (before copying) when the answer is already known.
	if m, err := s.decideLocked(ctx, id, req.Label); err != nil || m != nil {
		if m != nil {
			s.log.Debug("stage already committed", "id", id, "label", req.Label)
			return done(*m, nil)
		}
		return done(Meta{}, err)
	}

	dir, err := s.openCommitDir(id)
	if err != nil {
		return done(Meta{}, err)
	}
	defer dir.close(s.log)

	t1 := time.Now()
	allocated, err := placeLayer(ctx, req.Scratch, dir.path, adopt)
	if err != nil {
		return done(Meta{}, err)
	}
	tm.CopyMS = time.Since(t1).Milliseconds()
	if afterCopyHook != nil {
		afterCopyHook()
	}

	release, err := s.lock(ctx)
	if err != nil {
		return done(Meta{}, err)
	}
	defer release()
	all, err := s.List()
	if err != nil {
		return done(Meta{}, err)
	}
	existing, err := decide(all, id, req.Label)
	if err != nil {
		return done(Meta{}, err)
	}
	if existing != nil {
		return done(*existing, nil)
	}
	m, err := s.stageMeta(all, req, id, digest, size, allocated)
	if err != nil {
		return done(Meta{}, err)
	}
	if err := s.publishStage(dir, m); err != nil {
		return done(Meta{}, err)
	}
	s.log.Debug("committed stage", "id", id, "name", m.Name, "label", m.Label,
		"hash_ms", tm.HashMS, "copy_ms", tm.CopyMS)
	return done(m, nil)
}

// commitDir is a commit's temporary directory inside the store. Its lock
// file tells GC that a commit is still writing it.
type commitDir struct {
	path      string
	lock      *flock.Flock
	published bool // renamed into place; close leaves it alone
}

// openCommitDir creates and locks the temporary directory of a commit of
// stage id.
func (s *Store) openCommitDir(id string) (*commitDir, error) {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+id+"-")
	if err != nil {
		return nil, fmt.Errorf("creating commit directory: %w", err)
	}
	d := &commitDir{
		path: tmp,
		lock: flock.New(filepath.Join(tmp, ".lock"), flock.SetPermissions(0o600)),
	}
	if ok, err := d.lock.TryLock(); err != nil {
		d.close(s.log)
		return nil, fmt.Errorf("locking commit directory: %w", err)
	} else if !ok {
		d.close(s.log)
		return nil, fmt.Errorf("commit directory %s is locked by another process", tmp)
	}
	return d, nil
}

// close removes the directory unless it was published, and releases its
// lock.
func (d *commitDir) close(log *slog.Logger) {
	if !d.published {
		if err := os.RemoveAll(d.path); err != nil {
			log.Warn("removing commit directory", "dir", d.path, "err", err)
		}
	}
	_ = d.lock.Close()
}

// placeLayer copies the scratch layer sparsely into dir as its read-only
// layer file (adopt: moves it there and fsyncs it) and returns the bytes
// it allocates.
func placeLayer(ctx context.Context, scratch, dir string, adopt bool) (allocated int64, err error) {
	layer := filepath.Join(dir, layerFile)
	if adopt {
		allocated, err = adoptFile(scratch, layer)
	} else {
		allocated, err = copySparse(ctx, scratch, layer)
	}
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(layer, 0o444); err != nil {
		return 0, fmt.Errorf("making layer read-only: %w", err)
	}
	return allocated, nil
}

// stageMeta builds the meta of the new stage id, naming it apart from the
// names and labels of all. It runs under the store lock.
func (s *Store) stageMeta(all []Meta, req CommitRequest, id, digest string, size, allocated int64) (Meta, error) {
	chain := []string{id}
	if req.Parent != "" {
		parent, err := s.Get(req.Parent)
		if err != nil {
			return Meta{}, fmt.Errorf("commit parent vanished: %w", err)
		}
		chain = append(append([]string(nil), parent.Chain...), id)
	}
	taken := map[string]bool{}
	for _, m := range all {
		taken[m.Name] = true
		taken[m.Label] = true
	}
	taken[req.Label] = true
	now := time.Now().UTC()
	return Meta{
		ID:             id,
		Name:           StageName(id, taken),
		Label:          req.Label,
		Parent:         req.Parent,
		Chain:          chain,
		BaseFlavor:     req.BaseFlavor,
		BaseSHA256:     req.BaseSHA256,
		Digest:         digest,
		SizeBytes:      size,
		AllocatedBytes: allocated,
		Created:        now,
		CreatedUnix:    now.Unix(),
		Argv:           append([]string{}, req.Argv...),
		IsopodVersion:  s.version,
	}, nil
}

// publishStage writes m into d and renames d into place as stage m.ID,
// fsyncing both directories. It runs under the store lock.
func (s *Store) publishStage(d *commitDir, m Meta) error {
	if err := writeMeta(filepath.Join(d.path, metaFile), m); err != nil {
		return err
	}
	// The lock file goes before the rename; GC cannot interleave because
	// it also runs under the store lock.
	if err := os.Remove(filepath.Join(d.path, ".lock")); err != nil {
		return fmt.Errorf("removing commit lock: %w", err)
	}
	if err := syncDir(d.path); err != nil {
		return err
	}
	if err := os.Rename(d.path, filepath.Join(s.dir, m.ID)); err != nil {
		return fmt.Errorf("publishing stage %s: %w", m.ID, err)
	}
	d.published = true
	return syncDir(s.dir)
}

// decideLocked runs decide under the store lock.
func (s *Store) decideLocked(ctx context.Context, id, label string) (*Meta, error) {
	release, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	return decide(all, id, label)
}

// writeMeta writes m as an fsynced, read-only JSON file.
func writeMeta(path string, m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding stage meta: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("writing stage meta: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("writing stage meta: %w", err)
	}
	return nil
}
