package machine

import (
	"context"
	"fmt"
	"io"
	"time"
)

// A ready VM's warm-up before its claim (the ready pool: ready.go).

// readyWarmUp is the command a ready VM runs before its claim: it writes
// nothing (no file, in a cwd and an environment of nothing), and its
// process is gone before the claim.
var readyWarmUp = []string{"/bin/sh", "-c", "true"}

// WarmUp readies a restored VM for its claim: entropy, clock and
// hostname (no network: its NIC is parked until a run takes it), the root
// assembled from disks, and readyWarmUp run in it, so that its VMM has
// translated the guest's common paths before the call (under TCG each VMM
// process translates them afresh).
func (v *Machine) WarmUp(ctx context.Context, hostname string, disks Disks) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if err := v.Greet(ctx); err != nil {
		return fmt.Errorf("greeting a ready VM: %w", err)
	}
	if _, err := v.MakeOwn(ctx, hostname); err != nil {
		return err
	}
	if err := v.Mount(ctx, disks, "", true, deadline); err != nil {
		return fmt.Errorf("assembling a ready VM's root: %w", err)
	}
	res, err := v.Exec(ctx, Exec{Argv: readyWarmUp, Cwd: "/", Timeout: time.Until(deadline),
		Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		return fmt.Errorf("warming a ready VM up: %w", err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 || res.TimedOut {
		return fmt.Errorf("warming a ready VM up: %q did not exit 0", readyWarmUp)
	}
	return nil
}
