//go:build linux

// Command isopod-jail is the helper isopod starts, in fresh namespaces, for
// every VMM: it builds the jail's root, drops every privilege and executes
// the VMM in its own place. It is small so that it starts fast; isopod
// falls back to re-executing itself when it is not installed beside it.
// It is not run by hand.
package main

import "isopod/internal/jail/jailchild"

func main() { jailchild.Main() }
