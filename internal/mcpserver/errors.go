package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/oci"
	"isopod/internal/sandbox"
)

// How the server words failures. A refused argument is "<tool> refused:
// <argument>: <what is wrong> (got <value>)"; anything else isopod could
// not do is "<tool> failed (<class>): <error>. Fix: <next step>".
//
// The core says what it refuses in two ways. Its own request checks return
// a *errdefs.ArgError naming the field neutrally, which is said here with
// the tool argument's name. Other core messages (the stage store's, the
// egress policy's) are written for the CLI; mcpWords turns the flags and
// commands they name into this server's arguments and tools. Host commands
// a person must run (isopod image build ...) are left as they are.

// mcpWords rewrites the CLI's vocabulary in core messages into the MCP
// server's.
var mcpWords = strings.NewReplacer(
	"`isopod stage list`", "stage_list",
	"isopod stage list", "stage_list",
	"`isopod vm ls`", "vm_list",
	"`isopod image ls`", "image_list",
	"isopod image ls", "image_list",
	"`isopod stage rm ", "`stage_rm ",
	"`--stage base`", `stage "base"`,
	"--stage base", `stage "base"`,
	"--keep-last", "keep_last",
	"--commit-as", "commit_as",
	"--allow-host", "allow_hosts",
	"--allow-cidr", "allow_cidrs",
	"--deny-egress", "allow_hosts=[]",
	"--no-network", "network=false",
	"--stdin-file", "stdin_file",
	"--copy-out", "copy_out",
	"--timeout-s", "timeout_s",
	"--scratch-mib", "scratch_mib",
	"--mem-mib", "mem_mib",
	"--vcpus", "vcpus",
	"--stage", "stage",
	"--base", "base",
	"--env", "env",
	"--cwd", "cwd",
)

// isRefusal reports whether err is an argument problem: a *refusal, a
// *errdefs.ArgError or any invalid argument.
func isRefusal(err error) bool {
	var r *refusal
	var ae *errdefs.ArgError
	return errors.As(err, &r) || errors.As(err, &ae) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// refusalText words an argument problem of tool.
func refusalText(tool string, err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return tool + " refused: " + r.Error()
	}
	var ae *errdefs.ArgError
	if errors.As(err, &ae) {
		msg := tool + " refused: " + ae.Field + ": " + ae.Reason
		if ae.Value != "" {
			msg += " (got " + ae.Value + ")"
		}
		return msg
	}
	return tool + " refused: " + mcpWords.Replace(plain(err))
}

// classes are the errdefs sentinels, whose text a wrapped error ends with.
var classes = []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
	errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrNotSupported}

// plain is err's message without the class it was wrapped with at its end
// ("...: invalid argument"): the class is said separately.
func plain(err error) string {
	msg := err.Error()
	for _, c := range classes {
		if errors.Is(err, c) {
			msg = strings.TrimSuffix(msg, ": "+c.Error())
		}
	}
	return msg
}

// failure is the context of a failed call that picks its fix.
type failure struct {
	tool string
	// stage and base are a sandbox_run's: the stage it forked ("" for other
	// tools) and the base it asked for.
	stage, base string
}

// toolError turns a failure into a tool error a model can act on.
func (s *Server) toolError(ctx context.Context, f failure, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s cancelled: %v; any VM it started has been torn down", f.tool, err)
	}
	if isRefusal(err) {
		s.log.Info("tool refused", "tool", f.tool, "err", err)
		return errors.New(refusalText(f.tool, err))
	}
	class := errdefs.Class(err)
	fix := copyOutFix(err, class)
	if fix == "" {
		fix = damagedFix(err)
	}
	if fix == "" {
		fix = s.fix(ctx, f, class)
	}
	s.log.Info("tool failed", "tool", f.tool, "class", class, "err", err)
	return fmt.Errorf("%s failed (%s): %s. Fix: %s", f.tool, class, mcpWords.Replace(plain(err)), fix)
}

// fix names the next step: for a sandbox_run, from what the core says of
// the stage or base it asked for; otherwise the class's generic one.
func (s *Server) fix(ctx context.Context, f failure, class string) string {
	if f.tool != ToolSandboxRun || (class != "failed_precondition" && class != "not_found") {
		return fixFor(class)
	}
	base := f.base
	if f.stage != "" && f.stage != sandbox.BaseStage {
		// A fork boots the base its chain was made on, whatever the call
		// said; and the stage itself may be what is missing.
		info, err := s.cfg.Core.StageInfo(ctx, f.stage)
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Sprintf("there is no stage %q: stage_list shows the stages that exist (give a label, a name or a stage_id from it), or use stage \"base\" to start from a clean base.", f.stage)
		}
		if err != nil || info == nil {
			return fixFor(class)
		}
		base = info.Stage.BaseFlavor
	}
	if h := s.baseHint(ctx, base); h != "" {
		return h
	}
	return fixFor(class)
}

// baseHint asks the core how to make base usable, when it is not.
func (s *Server) baseHint(ctx context.Context, base string) string {
	if base == "" {
		return ""
	}
	res, err := s.cfg.Core.ImageList(ctx)
	if err != nil || res == nil {
		return ""
	}
	for _, im := range res.Images {
		if im.Flavor != base {
			continue
		}
		if im.Built && !im.Stale {
			return ""
		}
		why := "is not built"
		if im.Built {
			why = "is stale"
			if im.StaleReason != "" {
				why += " (" + im.StaleReason + ")"
			}
		}
		hint := im.Hint
		if hint == "" {
			hint = "build it with the isopod CLI (isopod image ls shows how)"
		}
		return fmt.Sprintf("base %s %s: %s", base, why, hint)
	}
	return fmt.Sprintf("there is no base named %s; image_list shows the bases this host has", base)
}

// copyOutFix names the next step after a copy-out (copy_out, read_files)
// that failed once the command had run, or "" for other failures.
func copyOutFix(err error, class string) string {
	var coe *machine.CopyOutError
	if !errors.As(err, &coe) {
		return ""
	}
	switch class {
	case "not_found":
		return "the command ran, but the guest file named above did not exist when it ended: check the path (absolute, inside the VM) or have cmd create it, and call again."
	case "failed_precondition":
		return "the host file named above was not ready to be written (a FIFO needs its reader running before the call); fix that on the host and call again."
	}
	return ""
}

// damagedFix names the next step for data that arrived damaged (a stage
// pull or an image import whose digest did not match): the source must be
// repaired; nothing on this host is missing.
func damagedFix(err error) string {
	var de *oci.DigestError
	if !errors.As(err, &de) {
		return ""
	}
	return "what arrived from the registry did not match its digest, and nothing was kept; ask the user to push the stage again from an intact copy, then call again."
}

// fixFor names the generic next step for an error class.
func fixFor(class string) string {
	switch class {
	case "invalid_argument":
		return "correct the argument named above and call again."
	case "not_found":
		return "stage_list shows the stages that exist and image_list the bases; check the name."
	case "already_exists":
		return "that label is taken: choose another commit_as label, or stage_rm the old stage first."
	case "failed_precondition":
		return "the host is not ready for this request; image_list shows which bases are built and how to build them, and a stage made over an older base must be rebuilt from stage \"base\"."
	case "unavailable":
		return "the VM or a resource did not answer in time; retry, raise timeout_s or mem_mib, and read serial_log_path of the VM in vm_list."
	case "not_supported":
		return "this host lacks something isopod needs (named above); it must be fixed on the host, not by a different call."
	case "resource_exhausted":
		return "a budget of this host is full (named above): stop or resume paused sessions you no longer need (session_list shows what each holds), or ask the operator to raise the setting named above."
	}
	return "this is a host-side isopod failure; retry once, and if it persists read the VM's logs (vm_list) or report it to whoever runs this server."
}

// Client input in replies. A message may quote what the client sent (a
// stage reference, a path, an argument's name), and the core's messages
// quote it in full: shortText cuts each quoted value longer than
// maxQuoted, and each unquoted word longer than maxWord, to a short head
// and its size, and then the whole message to maxErrorMessage, keeping its
// end (where the fix is). Every tool error and every JSON-RPC error the
// server sends goes through it.
const (
	maxQuoted = 256
	maxWord   = 512
	keptTail  = 512
)

func shortText(msg string) string {
	if len(msg) <= maxQuoted {
		return msg
	}
	msg = cutWords(cutQuoted(msg))
	if len(msg) <= maxErrorMessage {
		return msg
	}
	cut := fmt.Sprintf(" ... (%d bytes cut) ... ", len(msg)-maxErrorMessage+keptTail+64)
	head := strings.ToValidUTF8(msg[:maxErrorMessage-keptTail-len(cut)], "")
	return head + cut + strings.ToValidUTF8(msg[len(msg)-keptTail:], "")
}

// cutQuoted replaces each Go-quoted string longer than maxQuoted with a
// short head of its value.
func cutQuoted(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); {
		j := strings.IndexByte(msg[i:], '"')
		if j < 0 {
			b.WriteString(msg[i:])
			break
		}
		b.WriteString(msg[i : i+j])
		i += j
		end, ok := quoteEnd(msg, i)
		q := msg[i:end]
		i = end
		if !ok || len(q) <= maxQuoted {
			b.WriteString(q)
			continue
		}
		if v, err := strconv.Unquote(q); err == nil {
			b.WriteString(describe(v))
		} else {
			b.WriteString(headOf(q))
		}
	}
	return b.String()
}

// quoteEnd returns the index just past the quoted string that starts at
// msg[i], or where the scan stopped (a newline or the end) and false.
func quoteEnd(msg string, i int) (int, bool) {
	for k := i + 1; k < len(msg); k++ {
		switch msg[k] {
		case '\\':
			k++
		case '"':
			return k + 1, true
		case '\n':
			return k, false
		}
	}
	return len(msg), false
}

// cutWords replaces each run of text without white space longer than
// maxWord with its head.
func cutWords(msg string) string {
	var b strings.Builder
	for len(msg) > 0 {
		i := strings.IndexAny(msg, " \n\t")
		if i < 0 {
			i = len(msg)
		}
		if i > maxWord {
			b.WriteString(headOf(msg[:i]))
		} else {
			b.WriteString(msg[:i])
		}
		msg = msg[i:]
		if j := len(msg) - len(strings.TrimLeft(msg, " \n\t")); j > 0 {
			b.WriteString(msg[:j])
			msg = msg[j:]
		}
	}
	return b.String()
}

// headOf is the first maxShown characters of s and its size.
func headOf(s string) string {
	r := []rune(strings.ToValidUTF8(s[:min(len(s), 4*maxShown)], ""))
	return string(r[:min(len(r), maxShown)]) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}
