package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"isopod/internal/errdefs"
)

// DefaultDebianMirror is tried after the host's apt sources for a package
// pinned by its pool path.
const DefaultDebianMirror = "http://deb.debian.org/debian"

// maxPackageSize bounds a package download.
const maxPackageSize = 256 << 20

// errPoolMiss is one mirror answering 404 for a pool path.
var errPoolMiss = errors.New("not in this mirror's pool")

// newHTTPClient is the client used when BuildOptions gives none. It takes
// no proxy from the environment: the front ends own every setting.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 15 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}}
}

// poolMirrors lists the mirrors to try for a pool path: explicit alone when
// set, else every "deb" source configured under etcApt (a Debian mirror's
// pool serves every suite, and a local mirror or cache comes first) and then
// DefaultDebianMirror.
func poolMirrors(explicit, etcApt string) []string {
	if explicit != "" {
		return []string{strings.TrimRight(explicit, "/")}
	}
	var out []string
	srcs, _ := hostSources(etcApt)
	for _, s := range srcs {
		u := strings.TrimRight(s.URI, "/")
		if (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	if !slices.Contains(out, DefaultDebianMirror) {
		out = append(out, DefaultDebianMirror)
	}
	return out
}

// fetchFromPool downloads pin.Filename from the first of mirrors that has
// it into dir and returns its path. A mirror that does not have it or
// cannot be reached is passed over; a file whose sha256 is not pin.SHA256
// is refused at once.
func fetchFromPool(ctx context.Context, client *http.Client, log *slog.Logger, dir string, mirrors []string, pin Pin) (string, error) {
	if pin.Filename == "" || path.IsAbs(pin.Filename) || strings.Contains(pin.Filename, "..") {
		return "", fmt.Errorf("%s %s: pool path %q is not a relative mirror path: %w", pin.Package, pin.Version, pin.Filename, errdefs.ErrInvalidArgument)
	}
	if client == nil {
		client = newHTTPClient()
	}
	dst := filepath.Join(dir, path.Base(pin.Filename))
	var misses []string
	for _, m := range mirrors {
		url := m + "/" + pin.Filename
		err := downloadVerified(ctx, client, url, dst, pin.SHA256)
		if err == nil {
			log.Info("package fetched", "package", pin.Package, "version", pin.Version, "url", url)
			return dst, nil
		}
		if errors.Is(err, errdefs.ErrFailedPrecondition) || ctx.Err() != nil {
			return "", err
		}
		log.Info("mirror passed over", "url", url, "err", err)
		misses = append(misses, err.Error())
	}
	return "", fmt.Errorf("%s %s (%s) could not be fetched: %s: %w: %w",
		pin.Package, pin.Version, pin.Filename, strings.Join(misses, "; "), ErrNotServed, errdefs.ErrUnavailable)
}

// downloadVerified writes the body of url to dst while hashing it, and
// removes it again unless its sha256 is want.
func downloadVerified(ctx context.Context, client *http.Client, url, dst, want string) (retErr error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s: %w", url, errPoolMiss)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("creating download: %w", err)
	}
	defer func() {
		if cerr := f.Close(); retErr == nil && cerr != nil {
			retErr = cerr
		}
		if retErr != nil {
			os.Remove(dst)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, maxPackageSize+1))
	if err != nil {
		return fmt.Errorf("%s: reading: %w", url, err)
	}
	if n > maxPackageSize {
		return fmt.Errorf("%s: larger than %d MiB; refusing it: %w", url, maxPackageSize>>20, errdefs.ErrFailedPrecondition)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha256 mismatch: got %s, want %s; refusing to use it: %w", url, got, want, errdefs.ErrFailedPrecondition)
	}
	return nil
}
