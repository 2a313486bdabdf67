package supervisor

import (
	"fmt"
	"path/filepath"

	"isopod/internal/credential"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/workspace"
)

// SpecOf is what of req a session keeps, its workspace directory made
// absolute (the supervisor runs elsewhere). Every front end records a
// session's request through it.
func SpecOf(req sandbox.Request) (session.Spec, error) {
	sp := session.Spec{Stage: req.Stage, Base: req.Base, NoNetwork: req.NoNetwork, AllowLANEgress: req.AllowLANEgress,
		AllowHosts: req.AllowHosts, AllowCIDRs: req.AllowCIDRs, DenyEgress: req.DenyEgress, Inject: req.Inject,
		VCPUs: req.VCPUs, MemMiB: req.MemMiB, ScratchMiB: req.ScratchMiB, BootTimeoutS: req.TimeoutS,
		Env: req.Env, Cwd: req.Cwd}
	sp.DefaultBase, sp.ModelCaller = req.DefaultBase, req.Caller == credential.Model
	if w := req.Workspace; w != nil {
		abs, err := filepath.Abs(w.Host)
		if err != nil {
			return sp, fmt.Errorf("workspace %s: %w: %w", w.Host, err, errdefs.ErrInvalidArgument)
		}
		sp.WorkspaceHost, sp.WorkspaceGuest = abs, w.Guest
		sp.WorkspaceAll, sp.WorkspaceMaxBytes, sp.WorkspaceMaxFiles = w.All, w.MaxBytes, w.MaxFiles
	}
	return sp, nil
}

// RequestOf is the VM request of a session's spec; raise, when set, names
// the setting or flag that raises a workspace cap.
func RequestOf(sp session.Spec, raise func(what string) string) sandbox.Request {
	req := sandbox.Request{Stage: sp.Stage, Base: sp.Base, NoNetwork: sp.NoNetwork, AllowLANEgress: sp.AllowLANEgress,
		AllowHosts: sp.AllowHosts, AllowCIDRs: sp.AllowCIDRs, DenyEgress: sp.DenyEgress, Inject: sp.Inject,
		VCPUs: sp.VCPUs, MemMiB: sp.MemMiB, ScratchMiB: sp.ScratchMiB, TimeoutS: sp.BootTimeoutS}
	req.DefaultBase = sp.DefaultBase
	if sp.ModelCaller {
		req.Caller = credential.Model
	}
	if sp.WorkspaceHost != "" {
		w := &workspace.Request{Host: sp.WorkspaceHost, Guest: sp.WorkspaceGuest}
		w.All, w.MaxBytes, w.MaxFiles = sp.WorkspaceAll, sp.WorkspaceMaxBytes, sp.WorkspaceMaxFiles
		w.Raise = raise
		req.Workspace = w
	}
	return req
}
