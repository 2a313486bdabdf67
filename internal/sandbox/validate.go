package sandbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"isopod/internal/admission"
	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/egress"
	"isopod/internal/errdefs"
	"isopod/internal/store"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// argError is a refused request field (errdefs.ArgError).
var argError = errdefs.Arg

func checkVCPUs(n int, h admission.Host) error {
	maxCPU := min(h.CPUs, MaxVCPUs)
	if n < 1 || n > maxCPU || (n != 1 && n%2 != 0) {
		return argError("vcpus", n, "must be 1 or an even number, at most %d = min(host CPUs %d, %d)", maxCPU, h.CPUs, MaxVCPUs)
	}
	return nil
}

func checkMemMiB(n int, h admission.Host) error {
	maxMem := MaxMemMiB
	if h.MemTotalMiB > 0 {
		maxMem = min(maxMem, h.MemTotalMiB-512)
	}
	if n < MinMemMiB || n > maxMem {
		return argError("mem_mib", n, "must be between %d and %d = min(host MemTotal - 512, %d)", MinMemMiB, maxMem, MaxMemMiB)
	}
	return nil
}

func checkScratchMiB(n int) error {
	if n < MinScratchMiB || n > MaxScratchMiB {
		return argError("scratch_mib", n, "must be between %d and %d", MinScratchMiB, MaxScratchMiB)
	}
	return nil
}

func checkTimeoutS(n int) error {
	if n < 1 || n > MaxTimeoutS {
		return argError("timeout_s", n, "must be between 1 and %d seconds; it covers boot and command together", MaxTimeoutS)
	}
	return nil
}

// CheckSize checks one size a caller gave explicitly (field vcpus, mem_mib,
// scratch_mib or timeout_s) against its limits on this host. Unlike in a
// Request, where zero means the default, zero is a value here, and out of
// range. The error is the *errdefs.ArgError a Request with that value would get.
func CheckSize(field string, v int) error {
	h := admission.ReadHost()
	switch field {
	case "vcpus":
		return checkVCPUs(v, h)
	case "mem_mib":
		return checkMemMiB(v, h)
	case "scratch_mib":
		return checkScratchMiB(v)
	case "timeout_s":
		return checkTimeoutS(v)
	}
	return fmt.Errorf("sandbox: %q is not a size field", field)
}

// Normalize fills req's defaults and checks every field against this
// host, as Run does before anything starts; the request it returns is the
// one that runs. A front end may call it first, to refuse a request
// before it queues for a place or to learn the sizes it will get; Run
// normalises again, to the same request.
func Normalize(req Request) (Request, error) {
	return normalize(req, admission.ReadHost())
}

// WithDefaults returns r with the stage and the sizes it leaves zero set to
// their defaults. It is the one place these defaults are applied:
// Normalize starts with it, and a front end that must know a size before
// the request is checked (the memory it reserves) asks it.
func (r Request) WithDefaults() Request {
	if r.Stage == "" {
		r.Stage = BaseStage
	}
	if r.VCPUs == 0 {
		r.VCPUs = DefaultVCPUs
	}
	if r.MemMiB == 0 {
		r.MemMiB = DefaultMemMiB
	}
	if r.TimeoutS == 0 {
		r.TimeoutS = DefaultTimeoutS
	}
	return r
}

// The networks a run can have (see Request.NetworkMode).
const (
	NetworkNone     = string(egress.ModeOff)
	NetworkNAT      = string(egress.ModeNAT)
	NetworkFiltered = string(egress.ModeFiltered)
)

// netSwitches are r's network switches, unparsed.
func (r Request) netSwitches() egress.Switches {
	sw := egress.Switches{NoNetwork: r.NoNetwork, AllowLAN: r.AllowLANEgress,
		AllowHosts: r.AllowHosts, AllowCIDRs: r.AllowCIDRs, DenyAll: r.DenyEgress}
	return injectSwitches(r, sw)
}

// NetworkMode says which network r asks for (see egress.Switches.Mode):
// NetworkNone with NoNetwork; NetworkFiltered with DenyEgress, either
// allow list given, even empty, or credentials to inject; otherwise
// NetworkNAT.
func (r Request) NetworkMode() string { return string(r.netSwitches().Mode()) }

// normalize fills defaults and checks every field of req against h, before
// anything starts. The returned request is the one that runs.
func normalize(req Request, h admission.Host) (Request, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return req, invalid("no command: give the program and its arguments after --")
	}
	req = req.WithDefaults()
	if err := checkSizes(req, h); err != nil {
		return req, err
	}
	if err := checkIO(req); err != nil {
		return req, err
	}
	if err := checkInject(req); err != nil {
		return req, err
	}
	rules, err := egress.ParseRules(req.netSwitches())
	if err != nil {
		return req, err
	}
	// The parsed rules are what the run uses; DenyEgress says plainly that
	// filtered egress without a rule allows nothing.
	req.rules, req.DenyEgress = rules, rules.DenyAll()
	if req.CommitAs != "" {
		if err := validLabel(req.CommitAs); err != nil {
			return req, err
		}
	}
	if req.Workspace != nil {
		w := *req.Workspace
		if err := w.Check(); err != nil {
			return req, err
		}
		req.Workspace = &w
	}
	return req, nil
}

// checkSizes checks the VM's sizes and the timeout against h.
func checkSizes(req Request, h admission.Host) error {
	if err := checkVCPUs(req.VCPUs, h); err != nil {
		return err
	}
	if err := checkMemMiB(req.MemMiB, h); err != nil {
		return err
	}
	if req.ScratchMiB != 0 {
		if err := checkScratchMiB(req.ScratchMiB); err != nil {
			return err
		}
	}
	return checkTimeoutS(req.TimeoutS)
}

// checkIO checks the command's environment, working directory, stdin and
// copy-outs.
func checkIO(req Request) error {
	for _, kv := range req.Env {
		if err := agentproto.ValidEnv(kv); err != nil {
			return argError("env", nil, "%v", err)
		}
	}
	if req.Cwd != "" {
		if !strings.HasPrefix(req.Cwd, "/") {
			return argError("cwd", strconv.Quote(req.Cwd), "must be an absolute guest path")
		}
		if err := agentclient.CheckGuestPath("cwd", req.Cwd); err != nil {
			return err
		}
	}
	if req.CopyOutMaxData < 0 {
		return argError("copy_out_max_bytes", req.CopyOutMaxData, "must be positive (0 means the default, %d)", DefaultCopyOutMaxData)
	}
	for _, c := range req.CopyOut {
		if c.Guest == "" || !strings.HasPrefix(c.Guest, "/") {
			return argError("copy_out", c.Guest+":"+c.Host, "the guest path must be absolute")
		}
		if c.Host == "" {
			return argError("copy_out", c.Guest, "the host path is empty")
		}
		if err := agentclient.CheckGuestPath("copy_out", c.Guest); err != nil {
			return err
		}
	}
	return nil
}

// validLabel checks a --commit-as label by the store's one rule for new
// labels, before the run, so a bad label never costs a VM.
func validLabel(l string) error { return CheckLabel("commit_as", l) }

// CheckLabel checks the new stage label l, given as field, by the store's
// one rule for new labels.
func CheckLabel(field, l string) error {
	var le *store.LabelError
	if err := store.ValidateLabel(l); errors.As(err, &le) {
		return argError(field, strconv.Quote(l), "%s", le.Reason)
	} else if err != nil {
		return fmt.Errorf("%s: %w", errdefs.CLIFlag(field), err)
	}
	return nil
}
