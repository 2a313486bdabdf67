package image

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// AgentBinaryName is the guest agent's file name.
const AgentBinaryName = "isopod-agent"

const agentBuildHint = "reinstall the isopod package (it installs " + SystemAgentPath + "), or build it with " +
	"`CGO_ENABLED=0 go build -o bin/isopod-agent ./cmd/isopod-agent` and put it next to isopod, or set " + knobs.AgentBin

// SystemAgentPath is where the isopod packages install the guest agent.
const SystemAgentPath = "/usr/lib/isopod/" + AgentBinaryName

// Seams for tests.
var (
	executable     = os.Executable
	systemAgentDir = filepath.Dir(SystemAgentPath)
)

// LocateAgent finds the guest agent binary, the first of:
//
//   - explicit ($ISOPOD_AGENT_BIN, read by the front ends);
//   - isopod-agent next to the running executable (a checkout's bin/);
//   - lib/isopod/isopod-agent in the prefix the executable is installed
//     in, <prefix>/bin/isopod (an unpacked release tarball, /usr/local);
//   - /usr/lib/isopod/isopod-agent, where the packages install it;
//   - isopod-agent on PATH.
//
// It checks that the file is a static x86-64 ELF executable.
func LocateAgent(explicit string) (string, error) {
	p, from := explicit, knobs.AgentBin
	if p == "" {
		from = AgentBinaryName
		var cands []string
		if exe, err := executable(); err == nil {
			dir := filepath.Dir(exe)
			cands = append(cands, filepath.Join(dir, AgentBinaryName), filepath.Join(filepath.Dir(dir), "lib", "isopod", AgentBinaryName))
		}
		cands = append(cands, filepath.Join(systemAgentDir, AgentBinaryName))
		for _, cand := range cands {
			if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() {
				p = cand
				break
			}
		}
		if p == "" {
			if lp, err := exec.LookPath(AgentBinaryName); err == nil {
				p = lp
			}
		}
		if p == "" {
			return "", fmt.Errorf("guest agent %s not found (not in %s, next to the isopod binary, in its prefix's lib/isopod, in %s, or on PATH); %s: %w",
				AgentBinaryName, knobs.AgentBin, systemAgentDir, agentBuildHint, errdefs.ErrFailedPrecondition)
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if err := checkStaticELF(abs); err != nil {
		return "", fmt.Errorf("%s %s: %w; %s: %w", from, abs, err, agentBuildHint, errdefs.ErrFailedPrecondition)
	}
	return abs, nil
}

// ErrNotELF is a guest agent binary that is not an ELF file at all.
var ErrNotELF = errors.New("not an ELF executable")

// checkStaticELF accepts only a statically linked x86-64 ELF executable: the
// initramfs has no dynamic loader.
func checkStaticELF(path string) error {
	if _, err := os.Stat(path); err != nil {
		return err
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%w (%v)", ErrNotELF, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("built for %s, the guest is x86-64 (set GOARCH=amd64)", f.Machine)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s is not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it has a PT_INTERP program header); the initramfs needs a static binary")
		}
	}
	return nil
}
