package agent

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// waitThaw waits, at most 5 s, for sys's next thaw.
func waitThaw(t *testing.T, sys *fakeSystem) {
	t.Helper()
	select {
	case <-sys.thawed:
	case <-time.After(5 * time.Second):
		t.Fatal("the scratch filesystem was not thawed")
	}
}

func TestFreezeThaw(t *testing.T) {
	sys := &fakeSystem{thawed: make(chan struct{}, 4)}
	c := startAgent(t, Options{System: sys})
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze}, nil); err != nil {
		t.Fatal(err)
	}
	// One freeze at a time.
	err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze}, nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a second freeze: %v; want failed_precondition", err)
	}
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindThaw}, nil); err != nil {
		t.Fatal(err)
	}
	waitThaw(t, sys)
	if f, th := sys.freezeCounts(); f != 1 || th != 1 {
		t.Errorf("%d freezes, %d thaws; want 1 and 1", f, th)
	}
	// Nothing frozen: a thaw is refused and thaws nothing.
	err = c.call(&agentproto.Msg{Kind: agentproto.KindThaw}, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a thaw with no freeze: %v; want unavailable", err)
	}
	for _, ms := range []int64{-1, agentproto.MaxFreezeMS + 1} {
		err = c.call(&agentproto.Msg{Kind: agentproto.KindFreeze, FreezeMS: ms}, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("freeze_ms %d: %v; want invalid_argument", ms, err)
		}
	}
	if f, _ := sys.freezeCounts(); f != 1 {
		t.Errorf("%d freezes; refused requests froze", f)
	}
}

// A freeze whose thaw does not come ends on its own at its bound, and the
// late thaw is refused: the host's copy may be torn.
func TestFreezeBound(t *testing.T) {
	sys := &fakeSystem{thawed: make(chan struct{}, 4)}
	c := startAgent(t, Options{System: sys})
	t0 := time.Now()
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze, FreezeMS: 100}, nil); err != nil {
		t.Fatal(err)
	}
	waitThaw(t, sys)
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Errorf("thawed after %s; the bound is 100ms", d)
	}
	err := c.call(&agentproto.Msg{Kind: agentproto.KindThaw}, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a thaw after the bound: %v; want unavailable", err)
	}
	// The next freeze is served.
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindThaw}, nil); err != nil {
		t.Fatal(err)
	}
}

// A freeze ends with the connection that holds it, a session's too.
func TestFreezeEndsWithConnection(t *testing.T) {
	for _, session := range []bool{false, true} {
		sys := &fakeSystem{thawed: make(chan struct{}, 4)}
		c := startAgent(t, Options{System: sys})
		if session {
			if err := c.call(&agentproto.Msg{Kind: agentproto.KindSession}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze}, nil); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitThaw(t, sys)
		if f, th := sys.freezeCounts(); f != 1 || th != 1 {
			t.Errorf("session %v: %d freezes, %d thaws; want 1 and 1", session, f, th)
		}
	}
}

func TestFreezeWithoutSystem(t *testing.T) {
	c := startAgent(t, Options{})
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindFreeze}, nil); err == nil {
		t.Error("a freeze without a system succeeded")
	}
}

// A thaw sent before the freeze's answer (a host that gave up waiting)
// waits for that freeze and ends it: the freeze never takes hold after it.
func TestFreezeThawPipelined(t *testing.T) {
	sys := &fakeSystem{thawed: make(chan struct{}, 100)}
	c := startAgent(t, Options{System: sys})
	for i := range 50 {
		c.rawID++
		freezeID := c.rawID
		c.rawID++
		thawID := c.rawID
		var b bytes.Buffer
		agentproto.WriteFrame(&b, &agentproto.Msg{ID: freezeID, Kind: agentproto.KindFreeze}, nil)
		agentproto.WriteFrame(&b, &agentproto.Msg{ID: thawID, Kind: agentproto.KindThaw}, nil)
		c.wire.writeRaw(b.Bytes()) // both frames in one write
		if m := c.wire.await(t, freezeID, nil).m; m.Kind != agentproto.KindOK {
			t.Fatalf("round %d: freeze: %s %s", i, m.Kind, m.Error)
		}
		if m := c.wire.await(t, thawID, nil).m; m.Kind != agentproto.KindOK {
			t.Fatalf("round %d: thaw: %s %s; want it to wait for its freeze and end it", i, m.Kind, m.Error)
		}
	}
	if f, th := sys.freezeCounts(); f != 50 || th != 50 {
		t.Errorf("%d freezes, %d thaws; want 50 and 50", f, th)
	}
}
