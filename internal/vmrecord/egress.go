package vmrecord

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
	"isopod/internal/vmnet"
)

// EgressLogName is the flight recorder's file in a filtered run's VM
// directory.
const EgressLogName = vmnet.EgressLogName

// EgressSuggestResult is `isopod egress suggest`'s answer.
type EgressSuggestResult struct {
	OK        bool   `json:"ok"`
	VMID      string `json:"vm_id"`
	EgressLog string `json:"egress_log_path"`
	egress.Suggestion
}

// EgressSuggest reads a filtered run's egress record and returns the
// smallest allowlist that would have allowed everything it tried.
func (rs Records) EgressSuggest(_ context.Context, vmID string) (*EgressSuggestResult, error) {
	if !ValidID(vmID) {
		return nil, fmt.Errorf("egress suggest: %q is not a VM id (want vm-XXXXXXXX, the report's vm_id): %w", vmID, errdefs.ErrInvalidArgument)
	}
	path := filepath.Join(rs.Paths.VM(vmID), EgressLogName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(rs.Paths.VM(vmID)); serr != nil {
			return nil, fmt.Errorf("egress suggest: no VM %s under %s: %w", vmID, rs.Paths.VMs(), errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("egress suggest: %s has no egress record; only filtered runs keep one (rerun with --deny-egress to learn an allowlist): %w", vmID, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("egress suggest: %w", err)
	}
	defer f.Close()
	events, err := flightrec.ReadEvents(f)
	if err != nil {
		return nil, err
	}
	return &EgressSuggestResult{OK: true, VMID: vmID, EgressLog: path, Suggestion: egress.Suggest(flightrec.Attempts(events))}, nil
}
