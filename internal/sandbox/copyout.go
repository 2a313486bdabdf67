package sandbox

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/report"
)

// copyOut copies each requested guest file to its host path, staged so that
// a failure leaves the destination as it was. All copies together are
// bounded by the run's own timeout (counted again from here) and by the
// run's cap on data written to the host; holes stay holes.
func (r *run) copyOut(ctx context.Context) error {
	if len(r.req.CopyOut) == 0 {
		return nil
	}
	t := time.Now()
	cctx, cancel := context.WithTimeout(ctx, time.Duration(r.req.TimeoutS)*time.Second)
	defer cancel()
	budget := r.req.CopyOutMaxData
	if budget == 0 {
		budget = DefaultCopyOutMaxData
	}
	for _, c := range r.req.CopyOut {
		g := machine.GetFile{Guest: c.Guest, Host: c.Host, HostDir: c.HostDir, Staging: r.staging}
		fd, err := r.vm.GetFile(cctx, g, agentclient.CopyLimits{MaxSize: MaxCopyOutBytes, MaxData: budget})
		if err != nil {
			if cctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("not finished within the run's timeout (%d s, counted again for copy-out): %w", r.req.TimeoutS, errdefs.ErrUnavailable)
			}
			return &machine.CopyOutError{Guest: c.Guest, Host: c.Host, Err: err}
		}
		budget -= fd.Data
		r.rep.Copied = append(r.rep.Copied, report.Copied{Guest: c.Guest, Host: c.Host, Bytes: fd.Bytes})
	}
	ms := time.Since(t).Milliseconds()
	r.rep.CopyOutMS = &ms
	return nil
}

// staging records the staging file of the copy under way in the VM
// record, so that `isopod vm gc` removes it should this process die
// during the copy ("": the copy ended).
func (r *run) staging(path string) {
	r.dir.Rec.Staging = nil
	if path != "" {
		r.dir.Rec.Staging = []string{path}
	}
	r.dir.Save()
}
