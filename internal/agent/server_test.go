package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

func TestHelloAndPing(t *testing.T) {
	c := startAgent(t, Options{})
	if c.helloErr != nil || c.hello.Version != agentproto.Version || c.hello.AgentVersion != Version {
		t.Errorf("guest hello = %+v, %v; want version %d, agent version %q", c.hello, c.helloErr, agentproto.Version, Version)
	}
	if c.hello.Kernel == "" {
		t.Errorf("guest hello has no kernel release: %+v", c.hello)
	}
	if h, err := c.Hello(c.ctx()); err != nil || h.Version != agentproto.Version {
		t.Errorf("hello reply = %+v, %v; want a hello", h, err)
	}
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindPing}, nil), "")
	pong := c.wire.await(t, c.wire.lastSent(t, agentproto.KindPing), nil).m
	if pong.Kind != agentproto.KindPong || pong.Hello == nil || pong.Hello.Version != agentproto.Version {
		t.Errorf("ping reply = %+v; want a pong with a hello body", pong)
	}
}

func TestCustomHello(t *testing.T) {
	c := startAgent(t, Options{Hello: func() agentproto.Hello {
		return agentproto.Hello{BootError: "no base disk", ModulesMS: 1.5}
	}})
	h := c.hello
	if h.BootError != "no base disk" || h.ModulesMS != 1.5 || h.Version != agentproto.Version || h.AgentVersion != Version {
		t.Errorf("hello = %+v; want the custom fields plus the versions filled in", h)
	}
}

func TestProtoVersionOverride(t *testing.T) {
	tests := []struct {
		override string
		want     int
	}{
		{"", agentproto.Version},
		{"999", 999},
		{"not-a-number", agentproto.Version},
	}
	for _, tt := range tests {
		t.Run(tt.override, func(t *testing.T) {
			old := protoVersionOverride
			protoVersionOverride = tt.override
			t.Cleanup(func() { protoVersionOverride = old })
			if got := ProtoVersion(); got != tt.want {
				t.Errorf("ProtoVersion() = %d; want %d", got, tt.want)
			}
			c := startAgent(t, Options{})
			if c.hello.Version != tt.want {
				t.Errorf("hello version = %d; want %d", c.hello.Version, tt.want)
			}
			// The host refuses a guest of another protocol.
			if mismatch := tt.want != agentproto.Version; mismatch != errors.Is(c.helloErr, errdefs.ErrFailedPrecondition) {
				t.Errorf("the host's verdict on the hello: %v; want a refusal only for another version", c.helloErr)
			}
		})
	}
}

// Requests the host's client never makes are written raw.
func TestBadRequests(t *testing.T) {
	c := startAgent(t, Options{})
	tests := []struct {
		name string
		msg  agentproto.Msg
		want string
	}{
		{"unknown kind", agentproto.Msg{Kind: "bogus"}, `unknown message kind "bogus"`},
		{"empty argv", agentproto.Msg{Kind: agentproto.KindExec, Exec: &agentproto.Exec{}}, "argv is empty"},
		{"no exec body", agentproto.Msg{Kind: agentproto.KindExec}, "argv is empty"},
		{"bad env", agentproto.Msg{Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"true"}, Env: []string{"=x"}}}, "empty name"},
		{"env without =", agentproto.Msg{Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"true"}, Env: []string{"A"}}}, "want KEY=VALUE"},
		{"env with NUL", agentproto.Msg{Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"true"}, Env: []string{"A=b\x00"}}}, "contains NUL"},
		{"negative timeout", agentproto.Msg{Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"true"}, TimeoutMS: -1}}, "negative"},
		{"copy out without path", agentproto.Msg{Kind: agentproto.KindCopyOut}, "no path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.raw(&tt.msg, nil)
			if r.Kind != agentproto.KindError || !strings.Contains(r.Error, tt.want) {
				t.Errorf("reply = %s %q; want an error containing %q", r.Kind, r.Error, tt.want)
			}
		})
	}
	t.Run("reserved id", func(t *testing.T) {
		c.sendRaw(&agentproto.Msg{ID: 0, Kind: agentproto.KindPing}, nil)
		r := c.wire.await(t, 0, func(f frame) bool { return f.m.Kind == agentproto.KindError }).m
		if !strings.Contains(r.Error, "id 0 is reserved") {
			t.Errorf("reply to id 0 = %q; want it refused", r.Error)
		}
	})
	// The client sees the same refusals as errors.
	_, err := c.Exec(c.ctx(), agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"true"}, TimeoutMS: -1}})
	wantErr(t, err, "negative")
	wantErr(t, c.call(&agentproto.Msg{Kind: "bogus"}, nil), `unknown message kind "bogus"`)
}

// fakeSystem records machine operations instead of changing the host.
type fakeSystem struct {
	mu       sync.Mutex
	hostname string
	clock    time.Time
	net      *agentproto.NetConfig
	entropy  []byte
	bootID   string
	synced   int
	mount    *agentproto.Mount
	wsUpper  string
	wsLower  string
	fail     error
	// freezes and thaws count the scratch freezes; each thaw is also
	// sent on thawed when it is set.
	frozen         bool
	freezes, thaws int
	thawed         chan struct{}
}

func (f *fakeSystem) SetHostname(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hostname = name
	return f.fail
}

func (f *fakeSystem) SetClock(t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock = t
	return f.fail
}

func (f *fakeSystem) ConfigureNet(cfg agentproto.NetConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.net = &cfg
	return nil
}

func (f *fakeSystem) AddEntropy(seed []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entropy = append([]byte(nil), seed...)
	return f.fail
}

func (f *fakeSystem) SetBootID(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bootID = id
	return f.fail
}

func (f *fakeSystem) SyncDisks() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced++
	return f.fail
}

func TestMachineOps(t *testing.T) {
	sys := &fakeSystem{}
	c := startAgent(t, Options{System: sys})

	long := strings.Repeat("h", agentproto.MaxHostname+1)
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: long}, nil), "the limit is 64")
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSetHostname}, nil), "empty")
	if sys.hostname != "" {
		t.Fatalf("an invalid hostname reached the system: %q", sys.hostname)
	}
	max := strings.Repeat("h", agentproto.MaxHostname)
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: max}, nil), "")
	if sys.hostname != max {
		t.Errorf("hostname = %q; want %q", sys.hostname, max)
	}

	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSyncClock}, nil), "unix_nano")
	now := time.Now()
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: now.UnixNano()}}, nil), "")
	if !sys.clock.Equal(now) {
		t.Errorf("clock = %v; want %v", sys.clock, now)
	}

	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindAddEntropy}, nil), "empty")
	seed := []byte("0123456789abcdef")
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindAddEntropy}, seed), "")
	if !bytes.Equal(sys.entropy, seed) {
		t.Errorf("entropy = %q; want %q", sys.entropy, seed)
	}

	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSetBootID, BootID: "../../etc/passwd"}, nil), "not a lowercase UUID")
	const id = "0f8fad5b-d9cb-469f-a165-70867728950e"
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindSetBootID, BootID: id}, nil), "")
	if sys.bootID != id {
		t.Errorf("boot id = %q; want %q", sys.bootID, id)
	}
}

func TestConfigureNet(t *testing.T) {
	sys := &fakeSystem{}
	c := startAgent(t, Options{System: sys})
	bad := []struct {
		name string
		net  *agentproto.NetConfig
		want string
	}{
		{"missing", nil, "no net config"},
		{"not cidr", &agentproto.NetConfig{Address: "10.0.2.15"}, "IPv4 CIDR"},
		{"ipv6", &agentproto.NetConfig{Address: "fd00::2/64"}, "only IPv4"},
		{"gateway", &agentproto.NetConfig{Address: "10.0.2.15/24", Gateway: "nope"}, "gateway"},
		{"dns", &agentproto.NetConfig{Address: "10.0.2.15/24", DNS: []string{"dns.example"}}, "dns server"},
		{"mac", &agentproto.NetConfig{Address: "10.0.2.15/24", MAC: "zz"}, "mac"},
		{"env", &agentproto.NetConfig{Address: "10.0.2.15/24", Env: []string{"NOEQUALS"}}, "KEY=VALUE"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: tt.net}, nil), tt.want)
		})
	}
	if sys.net != nil {
		t.Fatalf("an invalid config reached the system: %+v", sys.net)
	}
	cfg := &agentproto.NetConfig{Address: "10.0.2.15/24", Gateway: "10.0.2.2", DNS: []string{"10.0.2.3"},
		Env: []string{"HTTP_PROXY=http://10.0.2.2:3128", "LANG=en_US.UTF-8"}}
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: cfg}, nil), "")
	if sys.net == nil || sys.net.Address != cfg.Address {
		t.Fatalf("system got %+v; want %+v", sys.net, cfg)
	}
	// The env of ConfigureNet applies to later execs, over the baseline and
	// under the request's own env.
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", `echo "$HTTP_PROXY|$LANG|$TERM"`}, Env: []string{"TERM=dumb"}})
	if got, want := string(r.stdout), "http://10.0.2.2:3128|en_US.UTF-8|dumb\n"; got != want {
		t.Errorf("exec env: got %q; want %q", got, want)
	}

	// The same configuration again (a resumed clone's) is already in
	// force: the system is not asked again, but the new env applies.
	sys.mu.Lock()
	sys.net = nil
	sys.mu.Unlock()
	again := *cfg
	again.Env = []string{"HTTP_PROXY=http://10.0.2.2:8080"}
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &again}, nil), "")
	if sys.net != nil {
		t.Errorf("the configuration in force was applied again: %+v", sys.net)
	}
	r = c.exec(agentproto.Exec{Argv: []string{"sh", "-c", `echo "$HTTP_PROXY"`}})
	if got := string(r.stdout); got != "http://10.0.2.2:8080\n" {
		t.Errorf("env after a repeated configure: got %q", got)
	}
	again.Env = cfg.Env
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &again}, nil), "")

	// A failure of the system is reported and keeps the old env.
	sys.mu.Lock()
	sys.fail = errors.New("no such device")
	sys.mu.Unlock()
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &agentproto.NetConfig{Address: "10.0.3.15/24", Env: []string{"HTTP_PROXY=x"}}}, nil), "no such device")
	r = c.exec(agentproto.Exec{Argv: []string{"sh", "-c", `echo "$HTTP_PROXY"`}})
	if got := string(r.stdout); got != "http://10.0.2.2:3128\n" {
		t.Errorf("env after a failed configure: got %q", got)
	}
}

func TestNoSystemRefusesMachineOps(t *testing.T) {
	c := startAgent(t, Options{})
	for _, m := range []agentproto.Msg{
		{Kind: agentproto.KindSetHostname, Hostname: "box"},
		{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: 1}},
		{Kind: agentproto.KindConfigureNet, Net: &agentproto.NetConfig{Address: "10.0.2.15/24"}},
	} {
		wantErr(t, c.call(&m, nil), "PID 1")
	}
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindAddEntropy}, []byte("x")), "PID 1")
}

func TestHalt(t *testing.T) {
	sys := &fakeSystem{}
	c := startAgent(t, Options{System: sys})
	res := c.startExec(agentproto.Exec{Argv: []string{"sh", "-c", "echo ready; exec sleep 30"}})
	start := time.Now()
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil), "")
	if err := c.serveResult(5 * time.Second); err != nil {
		t.Errorf("Serve after halt = %v; want nil", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("halt took %s with a running exec", d)
	}
	if sys.synced != 1 {
		t.Errorf("SyncDisks called %d times; want 1", sys.synced)
	}
	select {
	case r := <-res:
		if r.err != nil || r.signal() != int(unix.SIGKILL) {
			t.Errorf("exec running at halt ended with %+v, %v; want killed", r.done, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the exec running at halt did not end")
	}
}

func TestHaltSyncFailure(t *testing.T) {
	sys := &fakeSystem{fail: errors.New("disk gone")}
	c := startAgent(t, Options{System: sys})
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil), "disk gone")
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindPing}, nil), "")
}

func TestOversizeFrameEndsConnection(t *testing.T) {
	c := startAgent(t, Options{})
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[:4], agentproto.MaxFrame)
	c.wire.writeRaw(hdr[:])
	err := c.serveResult(5 * time.Second)
	if !errors.Is(err, agentproto.ErrFrameTooLarge) {
		t.Errorf("Serve = %v; want ErrFrameTooLarge", err)
	}
}

func TestGarbageHeaderEndsConnection(t *testing.T) {
	c := startAgent(t, Options{})
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, 4+3)
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = append(b, "{{{"...)
	c.wire.writeRaw(b)
	if err := c.serveResult(5 * time.Second); !errors.Is(err, agentproto.ErrBadHeader) {
		t.Errorf("Serve = %v; want a decoding error", err)
	}
}

func (f *fakeSystem) MountRoot(m agentproto.Mount) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mount = &m
	return f.fail
}

func (f *fakeSystem) WorkspaceLayers() (upper, lower string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wsUpper, f.wsLower
}

func (f *fakeSystem) FreezeScratch() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		return errors.New("already frozen")
	}
	f.frozen = true
	f.freezes++
	return f.fail
}

func (f *fakeSystem) ThawScratch() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		return errors.New("not frozen")
	}
	f.frozen = false
	f.thaws++
	if f.thawed != nil {
		f.thawed <- struct{}{}
	}
	return nil
}

// freezeCounts returns the freezes and thaws so far.
func (f *fakeSystem) freezeCounts() (freezes, thaws int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.freezes, f.thaws
}

// After a resume, a new host's first request is a hello: the agent tells
// it the highest id it has read, since what ran under the old host's ids
// runs on, and the host's next exec does not collide with them.
func TestHelloTellsLastID(t *testing.T) {
	c := startAgent(t, Options{})
	c.rawID++
	old := c.rawID
	c.sendRaw(&agentproto.Msg{ID: old, Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"sh", "-c", "echo up; exec sleep 30"}}}, nil)
	c.wire.await(t, old, func(f frame) bool { return f.m.Kind == agentproto.KindOutput })
	h, err := c.Hello(c.ctx())
	if err != nil || h.LastID != old {
		t.Fatalf("hello = %+v, %v; want LastID %d", h, err, old)
	}
	if r := c.execWith(agentproto.Exec{Argv: []string{"true"}}, nil, nil); r.err != nil || r.code() != 0 {
		t.Fatalf("exec after the hello: %+v, %v", r.done, r.err)
	}
	if id := c.wire.lastSent(t, agentproto.KindExec); id <= old {
		t.Errorf("the host's next exec has id %d; want one above %d", id, old)
	}
}
