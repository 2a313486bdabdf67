package cli

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	"isopod/internal/doctor"
	"isopod/internal/settings"
	"isopod/internal/version"
	"isopod/internal/warmpool"
)

func newDoctorCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host can run isopod: QEMU, KVM, the jail, kernel and images, disk space, the warm pool",
		Long: "Check that this host can run isopod and say, for each check, why it passed or failed and what to run.\n" +
			"Exits 0 when every required check passes (QEMU, the jail or ISOPOD_JAIL=off, the kernel, the initramfs,\n" +
			"a base image, disk space), 1 otherwise; KVM, the guest agent, each base and the warm pool only inform.",
		Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runDoctor(cmd.Context(), e) },
	}
}

func runDoctor(ctx context.Context, e *env) error {
	svc, err := e.service()
	if err != nil {
		return err
	}
	s := e.settings
	h := doctor.System(s.Paths, s.Kernel, s.AgentBin)
	h.VMM = svc.Prober
	h.WarmPool = func(ctx context.Context) (doctor.WarmPool, error) {
		l := warmpool.New(s.Paths, e.log).List(svc.WarmStale(ctx))
		wp := doctor.WarmPool{Snapshots: len(l.Snapshots), Stale: map[string]string{}}
		for _, s := range l.Snapshots {
			wp.Bytes += s.Allocated
			if s.Stale {
				wp.Stale[s.Key] = s.StaleReason
			}
		}
		return wp, nil
	}
	rep := doctor.Run(ctx, doctor.Config{
		Version: version.String(),
		Home:    s.Paths.Home,
		QEMU:    s.QEMU,
		Accel:   string(s.Accel),
		JailOff: s.Jail == settings.JailOff,
		Kernel:  s.Kernel,
	}, h)
	e.result = rep
	if !rep.OK {
		e.log.Error("isopod doctor: required checks failed", "failed", strings.Join(rep.Failed(), ","))
		e.code = 1
	}
	return nil
}
