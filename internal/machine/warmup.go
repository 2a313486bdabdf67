package machine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Warming a VM up before it serves a run: a ready VM before its claim
// (WarmUp) and an assembled snapshot's VM before its snapshot (WarmExec).

// readyWarmUp is the command a ready VM runs before its claim: it writes
// nothing (no file, in a cwd and an environment of nothing), and its
// process is gone before the claim.
var readyWarmUp = []string{"/bin/sh", "-c", "true"}

// WarmUp readies a restored VM for its claim: entropy, clock and
// hostname (no network: its NIC is parked until a run takes it), the root
// assembled from disks, and readyWarmUp run in it, so that its VMM has
// translated the guest's common paths before the call (under TCG each VMM
// process translates them afresh).
func (m *Machine) WarmUp(ctx context.Context, hostname string, disks Disks) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if err := m.Greet(ctx); err != nil {
		return fmt.Errorf("greeting a ready VM: %w", err)
	}
	if _, err := m.MakeOwn(ctx, hostname); err != nil {
		return err
	}
	if err := m.Mount(ctx, disks, "", true, deadline); err != nil {
		return fmt.Errorf("assembling a ready VM's root: %w", err)
	}
	res, err := m.Exec(ctx, Exec{Argv: readyWarmUp, Cwd: "/", Timeout: time.Until(deadline),
		Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		return fmt.Errorf("warming a ready VM up: %w", err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 || res.TimedOut {
		return fmt.Errorf("warming a ready VM up: %q did not exit 0", readyWarmUp)
	}
	return nil
}

// WarmExec runs, in an assembled snapshot's VM, the commands nearly every
// run starts with, so that a clone finds the root's lookups and the exec
// path cached. They write nothing to the root.
func (m *Machine) WarmExec(ctx context.Context, log *slog.Logger) {
	for _, argv := range [][]string{{"true"}, {"sh", "-c", ":"}} {
		_, err := m.Exec(ctx, Exec{Argv: argv, Env: []string{"PATH=" + warmPath}, Cwd: "/",
			Timeout: 10 * time.Second, Stdout: io.Discard, Stderr: io.Discard})
		if err != nil {
			log.Debug("warm pool: warming the exec path", "argv", argv, "err", err)
		}
	}
}

// warmPath is the warm-up commands' PATH.
const warmPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
