package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"isopod/internal/errdefs"
)

// Classify gives a registry's refusal its errdefs class and says what to
// do about it. what names the thing asked for ("image registry/repo:tag").
// Errors that already have a class, and cancellations, pass unchanged.
func Classify(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errdefs.Class(err) != "internal" {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%s: the registry refused access (%w): log in with `docker login` for that registry "+
				"(isopod reads Docker's config.json and credential helpers, from DOCKER_CONFIG or ~/.docker): %w",
				what, err, errdefs.ErrFailedPrecondition)
		case te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%s: not in the registry (%w): %w", what, err, errdefs.ErrNotFound)
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return fmt.Errorf("%s: the registry is not answering now (%w); try again later: %w", what, err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("%s: the registry refused (%w): %w", what, err, errdefs.ErrFailedPrecondition)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return fmt.Errorf("%s: cannot reach the registry (%w): %w", what, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// IsNotFound reports whether a registry said it does not have what was
// asked for.
func IsNotFound(err error) bool {
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode)
	}
	return errors.Is(err, errdefs.ErrNotFound)
}
