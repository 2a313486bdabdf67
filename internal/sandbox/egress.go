package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
)

// EgressLogName is the flight recorder's file in a filtered run's VM
// directory.
const EgressLogName = machine.EgressLogName

// EgressSuggestResult is `isopod egress suggest`'s answer.
type EgressSuggestResult struct {
	OK        bool   `json:"ok"`
	VMID      string `json:"vm_id"`
	EgressLog string `json:"egress_log_path"`
	egress.Suggestion
}

// EgressSuggest reads a filtered run's egress record and returns the
// smallest allowlist that would have allowed everything it tried.
func (s *Service) EgressSuggest(_ context.Context, vmID string) (*EgressSuggestResult, error) {
	if !validVMID(vmID) {
		return nil, fmt.Errorf("egress suggest: %q is not a VM id (want vm-XXXXXXXX, the report's vm_id): %w", vmID, errdefs.ErrInvalidArgument)
	}
	path := filepath.Join(s.opts.Paths.VM(vmID), EgressLogName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(s.opts.Paths.VM(vmID)); serr != nil {
			return nil, fmt.Errorf("egress suggest: no VM %s under %s: %w", vmID, s.opts.Paths.VMs(), errdefs.ErrNotFound)
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

// validVMID reports whether id has the form of a VM id.
func validVMID(id string) bool {
	rest, ok := strings.CutPrefix(id, "vm-")
	if !ok || len(rest) != 8 {
		return false
	}
	for _, c := range rest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// startNetwork starts a run's network under rules, the request's parsed
// network policy (the zero Rules: NAT), serving the parked socket nic (nil:
// a new one), with the endpoint of the credentials it injects.
func (s *Service) startNetwork(nic *machine.NIC, id, dir string, rules egress.Rules, start time.Time, creds ...machine.Credential) (*machine.Network, error) {
	return machine.StartNetwork(machine.NetConfig{Scope: s.opts.Paths.Scope(), ID: id, Dir: dir,
		Rules: rules, Start: start, NIC: nic, Credentials: creds, Logger: s.log})
}

// netReport is the report's network block.
func netReport(n *machine.Network) *NetReport {
	t := n.Totals()
	return &NetReport{Mode: n.Mode(), Flows: t.Flows, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown, LogPath: n.LogPath()}
}
