package supervisor_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"isopod/internal/image"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
	"isopod/internal/settings"
	"isopod/internal/vmm/vmmfake"
)

// A session's credentials are resolved again on every resume: an alias
// the store no longer has refuses the resume, naming it, and starts no VM.
func TestSupervisorResumeResolvesCredentialsAgain(t *testing.T) {
	p, kernel := sandboxtest.Root(t, image.FlavorBaseMin)
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.New(sandbox.Options{Settings: settings.Settings{Paths: p, Kernel: kernel, NoWarmPool: true, Jail: settings.JailOff,
		LookupEnv: func(k string) (string, bool) { return "tok-resolved-again", k == "GH_TOKEN" }}, Driver: d, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	writeStore := func(body string) {
		t.Helper()
		if err := os.WriteFile(sandbox.CredentialStore(p.Home), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeStore(`{"version":1,"credentials":{"gh":{"host":"api.example.org","scheme":"bearer","source":"env:GH_TOKEN","allow":["readonly"]}}}`)
	st := session.Store{Paths: p}
	rec, err := st.Create("cred", session.Spec{Inject: []string{"gh"}, Cwd: "/"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := &started{store: st, rec: rec, done: make(chan error, 1), drv: d, svc: svc,
		opts: func(o *supervisor.Options) { o.Request = sandbox.Request{Inject: []string{"gh"}} }}
	if a := s.run(t, false); !a.OK {
		t.Fatalf("start: %+v", a)
	}
	var p1 supervisor.PauseReport
	s.must(t, session.Call{Op: session.OpPause}, &p1)
	s.waitEnd(t)
	machines := len(d.Machines())

	writeStore(`{"version":1,"credentials":{"other":{"host":"api.example.org","scheme":"bearer","source":"env:GH_TOKEN","allow":["readonly"]}}}`)
	a := s.run(t, true)
	if a.OK || a.Class != "not_found" || !strings.Contains(a.Error, "gh") {
		t.Errorf("resume after the alias went: %+v; want not_found naming gh", a)
	}
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the supervisor did not end")
	}
	if n := len(d.Machines()); n != machines {
		t.Errorf("%d machines started by the refused resume; want none", n-machines)
	}
}
