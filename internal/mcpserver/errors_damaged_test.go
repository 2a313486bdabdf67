package mcpserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"isopod/internal/oci"
)

// A stage that arrived damaged is the source's fault: the fix says to push
// it again, not that the stage does not exist.
func TestToolErrorDamagedStage(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	err := fmt.Errorf("pull stage: %w", &oci.DigestError{What: "config", Want: "sha256:aa", Got: "sha256:bb"})
	got := s.toolError(context.Background(), failure{tool: ToolSandboxRun, stage: "team/deps"}, err).Error()
	for _, want := range []string{"failed (failed_precondition)", "want sha256:aa, got sha256:bb", "Fix: what arrived from the registry did not match its digest"} {
		if !strings.Contains(got, want) {
			t.Errorf("toolError = %q; want it to contain %q", got, want)
		}
	}
	if strings.Contains(got, "there is no stage") {
		t.Errorf("toolError = %q; says the stage does not exist", got)
	}
}
