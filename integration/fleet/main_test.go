// Package fleet tests isopod-mcp as a network service: servers listening
// on loopback, each with a state root of its own, sharing stages through
// an in-process OCI registry, admitting and cancelling calls with real
// VMs; it also checks the deployment manifests in deploy/ and, with
// ISOPOD_BENCH=1, measures the HTTP transport against stdio.
package fleet

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
