package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"isopod/internal/hostio/hostiotest"
	"isopod/internal/report"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
)

func TestToolErrorsNameTheFix(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		images *stages.ImageListResult
		args   map[string]any
		want   []string
	}{
		{"unbuilt base carries its build hint", fmt.Errorf("base base-debian: %w", errdefs.ErrFailedPrecondition),
			&stages.ImageListResult{OK: true, Images: []stages.ImageEntry{
				{Flavor: "base-min", Built: true},
				{Flavor: "base-debian", Hint: "isopod image build base-debian"},
			}}, map[string]any{"cmd": "true"},
			[]string{"failed_precondition", "base base-debian is not built", "isopod image build base-debian"}},
		{"stale base", fmt.Errorf("stale: %w", errdefs.ErrFailedPrecondition),
			&stages.ImageListResult{OK: true, Images: []stages.ImageEntry{
				{Flavor: "base-min", Built: true, Stale: true, StaleReason: "agent", Hint: "isopod image build base-min"},
			}}, map[string]any{"cmd": "true", "base": "base-min"},
			[]string{"is stale (agent)", "isopod image build base-min"}},
		{"without an image list, a generic fix", fmt.Errorf("kernel missing: %w", errdefs.ErrFailedPrecondition),
			nil, map[string]any{"cmd": "true"}, []string{"kernel missing", "image_list shows"}},
		{"label taken", fmt.Errorf("label proj/x: %w", errdefs.ErrAlreadyExists),
			nil, map[string]any{"cmd": "true", "commit_as": "proj/x"}, []string{"already_exists", "choose another commit_as label"}},
		{"unclassified", errors.New("disk full"), nil, map[string]any{"cmd": "true"}, []string{"internal", "disk full", "Fix:"}},
		{"a fork of an unknown stage names the stage, not the default base",
			fmt.Errorf("no stage matches %q (see `isopod stage list`): %w", "proj/none", errdefs.ErrNotFound),
			&stages.ImageListResult{OK: true, Images: []stages.ImageEntry{{Flavor: "base-debian", Hint: "isopod image build base-debian"}}},
			map[string]any{"cmd": "true", "stage": "proj/none"},
			[]string{`no stage matches "proj/none" (see stage_list)`, `there is no stage "proj/none": stage_list shows`}},
		{"a core refusal names the argument",
			&errdefs.ArgError{Field: "vcpus", Value: "4", Reason: "must be 1 or an even number, at most 2"},
			nil, map[string]any{"cmd": "true", "vcpus": 4},
			[]string{"sandbox_run refused: vcpus: must be 1 or an even number, at most 2 (got 4)"}},
		{"core flags become arguments",
			fmt.Errorf("--commit-as %q: the label is taken by stage st-1 (x); pick another label or remove it with `isopod stage rm x`: %w", "x", errdefs.ErrAlreadyExists),
			nil, map[string]any{"cmd": "true", "commit_as": "x"},
			[]string{`failed (already_exists): commit_as "x": the label is taken`, "`stage_rm x`"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core := &scriptedCore{images: tc.images, run: func(context.Context, sandbox.Request) (*report.Run, error) {
				return nil, tc.err
			}}
			s := connect(t, Config{Core: core, NoStartupGC: true})
			res := s.call(t, context.Background(), ToolSandboxRun, tc.args, nil)
			if !res.IsError {
				t.Fatal("an isopod failure was not a tool error")
			}
			for _, w := range tc.want {
				if !strings.Contains(resultText(res), w) {
					t.Errorf("error %q lacks %q", resultText(res), w)
				}
			}
			not := []string{"--", "isopod stage list", ": invalid argument"}
			if strings.Contains(tc.name, "unknown stage") {
				not = append(not, "base-debian is not built")
			}
			for _, cli := range not {
				if strings.Contains(resultText(res), cli) {
					t.Errorf("error %q says %q", resultText(res), cli)
				}
			}
		})
	}
}

func TestRefusalsNeverReachTheCore(t *testing.T) {
	h := newHostTree(t)
	tests := []struct {
		name   string
		policy func(hostio.Policy) hostio.Policy
		args   map[string]any
		want   []string
	}{
		{"copy_out escape", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "../outside/secret.txt"}}},
			[]string{h.Root, knobs.MCPHostIORoot}},
		{"copy_out through a symlink out", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "out-link"}}},
			[]string{h.Root, knobs.MCPHostIORoot}},
		{"copy_out dangling link/", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "in-dangling/"}}},
			[]string{"does not resolve"}},
		{"copy_out into the state dir", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": ".isopod/credentials.json"}}},
			[]string{"state directory"}},
		{"copy_out switched off", func(p hostio.Policy) hostio.Policy { p.CopyOut = false; return p },
			map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "fine.txt"}}},
			[]string{knobs.MCPCopyOut + "=off"}},
		{"stdin_file outside", nil, map[string]any{"stdin_file": h.Secret}, []string{h.Root, knobs.MCPHostIORoot}},
		{"stdin_file FIFO", nil, map[string]any{"stdin_file": "fifo"}, []string{"a FIFO"}},
		{"stdin_file 5 MiB", nil, map[string]any{"stdin_file": "big"}, []string{"4 MiB"}},
		{"stdin and stdin_file", nil, map[string]any{"stdin_file": "ok.txt", "stdin": "x"}, []string{"give one"}},
		{"filters without a network", nil, map[string]any{"network": false, "allow_hosts": []string{}}, []string{"sandbox_run refused: network: false removes the network card"}},
		{"bad env name", nil, map[string]any{"env": map[string]string{"A=B": "c"}}, []string{`env: the name "A=B" is invalid`}},
		{"empty cmd", nil, map[string]any{"cmd": " "}, []string{"sandbox_run refused: cmd: empty"}},
		{"relative guest path", nil, map[string]any{"copy_out": []map[string]string{{"guest": "out.txt", "host": "x"}}},
			[]string{`sandbox_run refused: copy_out[0].guest: give the file's absolute path inside the VM (got "out.txt")`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := h.policy()
			if tc.policy != nil {
				p = tc.policy(p)
			}
			core := &scriptedCore{}
			s := connect(t, Config{Core: core, HostIO: p, NoStartupGC: true})
			args := map[string]any{"cmd": "cat /etc/hostname"}
			for k, v := range tc.args {
				args[k] = v
			}
			before := hostiotest.Snapshot(t, h.Base)
			res := s.call(t, context.Background(), ToolSandboxRun, args, nil)
			hostiotest.SameSnapshot(t, before, hostiotest.Snapshot(t, h.Base))
			if !res.IsError {
				t.Fatalf("accepted: %s", resultText(res))
			}
			if n := len(core.requests()); n != 0 {
				t.Errorf("the core saw %d runs", n)
			}
			for _, w := range append(tc.want, "sandbox_run refused") {
				if !strings.Contains(resultText(res), w) {
					t.Errorf("error %q lacks %q", resultText(res), w)
				}
			}
		})
	}
}

func TestSchemaRejectsBadInput(t *testing.T) {
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	for _, args := range []map[string]any{
		{},
		{"cmd": "true", "bogus": 1},
		{"cmd": "true", "timeout_s": sandbox.MaxTimeoutS + 1},
		{"cmd": "true", "mem_mib": 1},
		{"cmd": "true", "network": "yes"},
	} {
		if res := s.call(t, context.Background(), ToolSandboxRun, args, nil); !res.IsError {
			t.Errorf("%v accepted", args)
		}
	}
	if n := len(core.requests()); n != 0 {
		t.Errorf("the core saw %d runs", n)
	}
}

// Every class the core answers has a fix of its own, never the generic
// one for a host-side failure.
func TestEveryClassHasItsFix(t *testing.T) {
	generic := fixFor("internal")
	for _, err := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
		errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrNotSupported, errdefs.ErrResourceExhausted} {
		if c := errdefs.Class(err); fixFor(c) == generic {
			t.Errorf("class %s gets the generic fix", c)
		}
	}
}
