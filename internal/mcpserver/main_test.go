package mcpserver

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		os.Exit(serveForTest())
	}
	os.Exit(func() int {
		// The servers these tests start run a copy of this binary from a
		// directory anyone may read: the VMM jail executes the running
		// binary again as an unprivileged user, which the build cache's
		// private directories would refuse.
		dir, err := os.MkdirTemp("", "isopod-mcp-test-")
		if err == nil {
			defer os.RemoveAll(dir)
			err = copyExecutable(os.Args[0], filepath.Join(dir, "isopod-mcp.test"))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "copying the test binary: %v\n", err)
			return 1
		}
		serverBin = filepath.Join(dir, "isopod-mcp.test")
		// The servers these tests start, and the VM tests' settings, use a
		// private state root, never the user's.
		return e2e.PrivateHome(m)
	}())
}

// serverBin is the copy of this test binary the tests run as the server.
var serverBin string

// copyExecutable copies an executable into a fresh file that anyone may
// read and execute, in a directory anyone may enter.
func copyExecutable(from, to string) error {
	if err := os.Chmod(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
