//go:build linux

package jailchild

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The helper executes the VMM only once the parent says it placed it in
// its cgroups: a byte 1 on the sync socket. A parent that went away, or
// sent anything else, stops it.
func TestWaitPlaced(t *testing.T) {
	for _, tc := range []struct {
		name string
		send []byte // nil: the parent closes its end without a word
		ok   bool
	}{
		{"placed", []byte{1}, true},
		{"parent gone", nil, false},
		{"another byte", []byte{0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.send != nil {
				if _, err := unix.Write(fds[0], tc.send); err != nil {
					t.Fatal(err)
				}
			}
			unix.Close(fds[0])
			if err := waitPlaced(fds[1]); (err == nil) != tc.ok {
				t.Errorf("waitPlaced: %v; want ok %v", err, tc.ok)
			}
		})
	}
}
