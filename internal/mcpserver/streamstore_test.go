package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStreamStoreBounds: a running call keeps its last maxKeptNotices
// notifications; finished streams go when they are older than the store
// keeps them, and the oldest first while the store is over its budget;
// running ones are never let go.
func TestStreamStoreBounds(t *testing.T) {
	notice := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`
	result := func(id int, size int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":%q}]}}`, id, strings.Repeat("r", size))
	}
	st := newStreamStore(time.Hour, 64<<10)
	running := st.open("p", json.RawMessage("1"), "2025-11-25")
	for range 3 * maxKeptNotices {
		running.addEvent([]byte(notice))
	}
	kept := 0
	for _, ev := range running.events {
		if ev != nil {
			kept++
		}
	}
	if kept != maxKeptNotices || len(running.events) != 3*maxKeptNotices {
		t.Errorf("a running call keeps %d of %d notifications; want %d", kept, len(running.events), maxKeptNotices)
	}
	var done []*callStream
	for i := range 10 {
		cs := st.open("p", json.RawMessage(fmt.Sprint(i+2)), "2025-11-25")
		cs.start()
		cs.addEvent([]byte(result(i+2, 16<<10)))
		cs.finish()
		done = append(done, cs)
	}
	if n := st.bytes.Load(); n > 64<<10 {
		t.Errorf("the store holds %d bytes, over its budget", n)
	}
	if st.get(running.id) == nil || st.get(done[9].id) == nil {
		t.Error("the running stream or the newest finished one was let go")
	}
	if st.get(done[0].id) != nil {
		t.Error("the oldest finished stream is kept past the budget")
	}
	short := newStreamStore(0, 1<<30) // every finished stream is past its keep
	cs := short.open("p", json.RawMessage("1"), "2025-06-18")
	cs.start()
	cs.addEvent([]byte(result(1, 10)))
	cs.finish()
	if short.get(cs.id) != nil || short.bytes.Load() != 0 {
		t.Errorf("a stream past its keep is still held (%d bytes)", short.bytes.Load())
	}
	// Under the 2026-07-28 protocol nothing is kept.
	st26 := newStreamStore(time.Hour, 1<<30)
	cs = st26.open("p", json.RawMessage("1"), "2026-07-28")
	cs.start()
	cs.addEvent([]byte(result(1, 10)))
	cs.finish()
	if st26.get(cs.id) != nil {
		t.Error("a 2026-07-28 stream is kept for resumption")
	}
}
