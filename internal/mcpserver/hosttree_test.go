package mcpserver

import (
	"isopod/internal/hostio/hostiotest"
	"testing"

	"isopod/internal/hostio"
)

// hostTree is the confinement fixture of hostiotest, with the policy
// that confines to its root.
type hostTree struct{ hostiotest.Tree }

func newHostTree(t *testing.T) hostTree {
	t.Helper()
	return hostTree{hostiotest.NewTree(t, hostio.MaxStdinFileBytes)}
}

func (h hostTree) policy() hostio.Policy {
	return hostio.Policy{Root: h.Root, Home: h.Home, StdinFile: true, CopyOut: true}
}
