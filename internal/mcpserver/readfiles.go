package mcpserver

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"isopod/internal/agentclient"
	"isopod/internal/machine"
	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// read_files brings guest files back inside the result, for clients that
// do not own the server's disk (a remote agent). The server copies them
// out through the core's copy-out (binary-safe, staged, bounded) into a
// private temporary directory of its own, given to the core as a
// descriptor (CopyOut.HostDir), reads them back into the result and
// removes the directory before it answers.

// Caps of read_files.
const (
	// MaxReadFiles is how many paths one call may name.
	MaxReadFiles = 16
	// MaxReadFilesInline caps the content returned for all of a call's
	// files together; a file past it is cut (truncated).
	MaxReadFilesInline = 4 << 20
	// MaxReadFilesData caps the data copied to the server for them: a
	// file whose data is larger fails the copy, and the call, as copy_out
	// does past its cap.
	MaxReadFilesData = 64 << 20
)

// FileResult is one read_files entry in the result.
type FileResult struct {
	Guest string `json:"guest"`
	// Bytes is the file's whole size.
	Bytes int64 `json:"bytes"`
	// Encoding says how content is written: utf-8 (the file is valid
	// UTF-8 without NUL bytes) or base64.
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
	// Truncated: content holds only the file's first bytes (the call's
	// files together went past MaxReadFilesInline).
	Truncated bool `json:"truncated,omitempty"`
}

// readFiles is one call's read_files: the guest paths and where their
// copies land.
type readFiles struct {
	guests []string
	tmp    string
	dir    *os.File
}

// prepareReadFiles adds read_files' copies to r. release removes the
// private directory; call it once the result is built.
func prepareReadFiles(r *sandbox.Request, guests []string) (*readFiles, error) {
	if len(guests) == 0 {
		return nil, nil
	}
	if len(guests) > MaxReadFiles {
		return nil, &refusal{"read_files", fmt.Sprintf("names %d files; at most %d (archive them with tar in cmd and read the archive)", len(guests), MaxReadFiles)}
	}
	for i, g := range guests {
		if !strings.HasPrefix(g, "/") {
			return nil, &refusal{fmt.Sprintf("read_files[%d]", i), fmt.Sprintf("give the file's absolute path inside the VM (got %s)", describe(g))}
		}
		if err := agentclient.CheckGuestPath(fmt.Sprintf("read_files[%d]", i), g); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "isopod-mcp-read-")
	if err != nil {
		return nil, fmt.Errorf("read_files: a private directory: %w", err)
	}
	dir, err := os.Open(tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("read_files: %w", err)
	}
	rf := &readFiles{guests: guests, tmp: tmp, dir: dir}
	for i, g := range guests {
		r.CopyOut = append(r.CopyOut, sandbox.CopyOut{Guest: g, Host: rf.host(i), HostDir: dir})
	}
	if r.CopyOutMaxData == 0 && len(r.CopyOut) > len(guests) {
		r.CopyOutMaxData = sandbox.DefaultCopyOutMaxData
	}
	r.CopyOutMaxData += MaxReadFilesData
	return rf, nil
}

func (rf *readFiles) host(i int) string { return filepath.Join(rf.tmp, fmt.Sprintf("file-%02d", i)) }

// release removes the copies.
func (rf *readFiles) release() {
	if rf == nil {
		return
	}
	rf.dir.Close()
	os.RemoveAll(rf.tmp)
}

// collect reads the copies into the result, within MaxReadFilesInline,
// and takes them out of rep.Copied (the client named no host path).
// A run that timed out copied nothing: the entries are left out, with a
// warning.
func (rf *readFiles) collect(rep *report.Run) ([]FileResult, []string) {
	if rf == nil {
		return nil, nil
	}
	var kept []report.Copied
	for _, c := range rep.Copied {
		if !strings.HasPrefix(c.Host, rf.tmp+"/") {
			kept = append(kept, c)
		}
	}
	rep.Copied = kept
	if rep.TimedOut || rep.GuestDied {
		return nil, []string{"read_files: nothing was read back: the command did not finish"}
	}
	budget := int64(MaxReadFilesInline)
	var out []FileResult
	var warns []string
	for i, g := range rf.guests {
		fr, err := readBack(rf.host(i), g, budget)
		if err != nil {
			warns = append(warns, fmt.Sprintf("read_files[%d] %s: %v", i, g, err))
			continue
		}
		budget -= int64(len(fr.raw))
		out = append(out, fr.FileResult)
	}
	return out, warns
}

type readBackResult struct {
	FileResult
	raw []byte
}

// readBack reads at most budget bytes of one copy.
func readBack(path, guest string, budget int64) (readBackResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return readBackResult{}, errors.New("it was not copied")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return readBackResult{}, err
	}
	raw, err := io.ReadAll(io.LimitReader(f, max(budget, 0)))
	if err != nil {
		return readBackResult{}, err
	}
	return readBackResult{FileResult: inlineFile(guest, raw, fi.Size()), raw: raw}, nil
}

// inlineFile is a file of size bytes, of which raw are the first, as a
// result carries it: text as it is (cut on a character boundary), else
// base64.
func inlineFile(guest string, raw []byte, size int64) FileResult {
	r := FileResult{Guest: guest, Bytes: size, Truncated: int64(len(raw)) < size}
	text := raw
	if r.Truncated {
		// Cut text on a character boundary.
		for n := 0; n < utf8.UTFMax && len(text) > 0 && !utf8.Valid(text); n++ {
			text = text[:len(text)-1]
		}
	}
	if utf8.Valid(text) && !strings.ContainsRune(string(text), 0) {
		r.Encoding, r.Content = "utf-8", string(text)
		return r
	}
	r.Encoding, r.Content = "base64", base64.StdEncoding.EncodeToString(raw)
	return r
}

// reword says a copy-out failure of a read_files copy in read_files'
// words: the core names the private path the client never gave. Other
// errors, copy_out's own included, are returned as they are.
func (rf *readFiles) reword(err error) error {
	var coe *machine.CopyOutError
	if rf == nil || !errors.As(err, &coe) || filepath.Dir(coe.Host) != rf.tmp {
		return err
	}
	msg := err.Error()
	for i, g := range rf.guests {
		msg = strings.ReplaceAll(msg, "--copy-out "+g+":"+rf.host(i), fmt.Sprintf("read_files[%d] %s", i, g))
		msg = strings.ReplaceAll(msg, rf.host(i), "(read_files)")
	}
	return &reworded{msg: msg, err: err}
}

// reworded is an error said differently, its class kept.
type reworded struct {
	msg string
	err error
}

func (r *reworded) Error() string { return r.msg }
func (r *reworded) Unwrap() error { return r.err }
