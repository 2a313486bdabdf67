//go:build linux

package jailchild

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	good, err := Encode(Spec{Path: "/bin/true", Argv: []string{"/bin/true"}, SyncFD: 5, ExeFD: 6,
		Binds: []Bind{{Src: "/usr/bin/true", At: "/bin/true"}}, Rlimits: []Rlimit{{Resource: 4, Max: 0}}})
	if err != nil {
		t.Fatal(err)
	}
	const stale = "the jail helper /x/isopod-jail is from another isopod build"
	for _, tc := range []struct {
		name, spec, want string
	}{
		{"this build's", good, ""},
		{"another version", strings.Replace(good, `"version":"`+Version+`"`, `"version":"0"`, 1), stale},
		{"no version", strings.Replace(good, `"version":"`+Version+`",`, ``, 1), stale},
		{"an unknown field", strings.Replace(good, `"path":`, `"seccomp":"off","path":`, 1), stale},
		{"an unknown bind field", strings.Replace(good, `"at":`, `"rw":true,"at":`, 1), stale},
		{"not JSON", "{", "cannot read"},
		{"trailing data", good + `{}`, "cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Decode(tc.spec, "/x/isopod-jail")
			if tc.want == "" {
				if err != nil || s.Path != "/bin/true" || s.SyncFD != 5 || len(s.Binds) != 1 || len(s.Rlimits) != 1 {
					t.Errorf("Decode: %+v, %v", s, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode: %v; want %q", err, tc.want)
			}
			if tc.want == stale && !strings.HasSuffix(err.Error(), "; reinstall isopod") {
				t.Errorf("Decode: %v; want it to end with the fix", err)
			}
		})
	}
}

// TestSyncFD: the sync socket is found in any version's spec, so that a
// refusal reaches the parent.
func TestSyncFD(t *testing.T) {
	for spec, want := range map[string]int{
		`{"version":"0","sync_fd":7,"future":1}`: 7,
		`{"version":"1"}`:                        -1,
		`{"sync_fd":1}`:                          -1,
		`nonsense`:                               -1,
	} {
		if got := syncFD(spec); got != want {
			t.Errorf("syncFD(%s) = %d; want %d", spec, got, want)
		}
	}
}
