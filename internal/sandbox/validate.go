package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"isopod/internal/agentproto"
	"isopod/internal/egress"
	"isopod/internal/errdefs"
)

// hostLimits are the host facts request validation depends on.
type hostLimits struct {
	CPUs        int
	MemTotalMiB int
}

func readHostLimits() hostLimits {
	h := hostLimits{CPUs: runtime.NumCPU(), MemTotalMiB: 0}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return h
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(fields[1])
			h.MemTotalMiB = kb / 1024
		}
	}
	return h
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// normalize fills defaults and checks every field of req against h, before
// anything starts. The returned request is the one that runs.
func normalize(req Request, h hostLimits) (Request, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return req, invalid("no command: give the program and its arguments after --")
	}
	if req.Stage == "" {
		req.Stage = BaseStage
	}
	if req.VCPUs == 0 {
		req.VCPUs = DefaultVCPUs
	}
	maxCPU := min(h.CPUs, MaxVCPUs)
	if req.VCPUs < 1 || req.VCPUs > maxCPU || (req.VCPUs != 1 && req.VCPUs%2 != 0) {
		return req, invalid("--vcpus %d: must be 1 or an even number, at most %d (min(host CPUs %d, %d))", req.VCPUs, maxCPU, h.CPUs, MaxVCPUs)
	}
	if req.MemMiB == 0 {
		req.MemMiB = DefaultMemMiB
	}
	maxMem := MaxMemMiB
	if h.MemTotalMiB > 0 {
		maxMem = min(maxMem, h.MemTotalMiB-512)
	}
	if req.MemMiB < MinMemMiB || req.MemMiB > maxMem {
		return req, invalid("--mem-mib %d: must be between %d and %d (min(host MemTotal - 512, %d))", req.MemMiB, MinMemMiB, maxMem, MaxMemMiB)
	}
	if req.ScratchMiB != 0 && (req.ScratchMiB < MinScratchMiB || req.ScratchMiB > MaxScratchMiB) {
		return req, invalid("--scratch-mib %d: must be between %d and %d", req.ScratchMiB, MinScratchMiB, MaxScratchMiB)
	}
	if req.TimeoutS == 0 {
		req.TimeoutS = DefaultTimeoutS
	}
	if req.TimeoutS < 1 || req.TimeoutS > MaxTimeoutS {
		return req, invalid("--timeout-s %d: must be between 1 and %d seconds (it covers boot and exec together)", req.TimeoutS, MaxTimeoutS)
	}
	for _, kv := range req.Env {
		if err := agentproto.ValidEnv(kv); err != nil {
			return req, invalid("--env: %v", err)
		}
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return req, invalid("--cwd %q: must be an absolute guest path", req.Cwd)
	}
	if req.Stdin != nil && req.StdinFile != "" {
		return req, invalid("stdin: give either a stdin file or stdin data, not both")
	}
	for _, c := range req.CopyOut {
		if c.Guest == "" || !strings.HasPrefix(c.Guest, "/") {
			return req, invalid("--copy-out %s:%s: the guest path must be absolute", c.Guest, c.Host)
		}
		if c.Host == "" {
			return req, invalid("--copy-out %s: empty host path", c.Guest)
		}
	}
	filtered := req.DenyEgress || len(req.AllowHosts) > 0 || len(req.AllowCIDRs) > 0
	if req.NoNetwork && (filtered || req.AllowLANEgress) {
		return req, invalid("--no-network cannot be combined with --allow-host, --allow-cidr, --deny-egress or --allow-lan-egress: a run has no NIC or a filtered one, pick one")
	}
	if req.DenyEgress && (len(req.AllowHosts) > 0 || len(req.AllowCIDRs) > 0) {
		return req, invalid("--deny-egress cannot be combined with --allow-host or --allow-cidr: deny-egress allows nothing")
	}
	for _, c := range req.AllowCIDRs {
		if _, err := egress.ParseCIDR(c); err != nil {
			return req, err // names the flag and the value
		}
	}
	for _, h := range req.AllowHosts {
		if _, err := egress.ParsePattern(h); err != nil {
			return req, err // names the flag and the value
		}
	}
	if req.CommitAs != "" {
		if err := validLabel(req.CommitAs); err != nil {
			return req, err
		}
	}
	return req, nil
}

// validLabel checks a --commit-as label before the run, so a bad label never
// costs a VM.
func validLabel(l string) error {
	switch {
	case l == BaseStage:
		return invalid("--commit-as %q: %q is the reserved empty stage", l, BaseStage)
	case len(l) > 128:
		return invalid("--commit-as: label longer than 128 bytes")
	case strings.HasPrefix(l, "-"):
		return invalid("--commit-as %q: a label cannot start with '-'", l)
	case strings.HasPrefix(l, "st-"):
		return invalid("--commit-as %q: labels starting with st- would shadow stage ids", l)
	}
	for _, r := range l {
		if r < 0x21 || r == 0x7f {
			return invalid("--commit-as %q: labels are printable, without spaces", l)
		}
	}
	return nil
}
