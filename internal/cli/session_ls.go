package cli

import (
	"cmp"
	"time"

	"isopod/internal/admission"
	"isopod/internal/ledger"
	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// sessionRow is one session as `isopod session ls` lists it: its record,
// the memory its VM holds while running (guest memory plus the VMM's
// allowance, as the ledger counts it; 0 otherwise) and the disk its
// directory takes (allocated blocks: a sparse disk counts what it holds).
type sessionRow struct {
	*session.Record
	MemoryMiB int   `json:"memory_mib"`
	DiskBytes int64 `json:"disk_bytes"`
	// AgeS is the seconds since the session started; IdleS since its
	// last call.
	AgeS  int64 `json:"age_s"`
	IdleS int64 `json:"idle_s"`
}

// sessionList is `isopod session ls`'s answer: every session, and what
// they hold together.
type sessionList struct {
	OK       bool         `json:"ok"`
	Sessions []sessionRow `json:"sessions"`
	Total    struct {
		Running   int   `json:"running"`
		MemoryMiB int   `json:"memory_mib"`
		DiskBytes int64 `json:"disk_bytes"`
	} `json:"total"`
}

func (e *env) sessionList(recs []*session.Record) sessionList {
	st := e.sessions()
	held := map[string]int{} // a session's place in the ledger, by id
	entries, _ := ledger.Read(e.settings.Paths.Ledger())
	for _, en := range entries {
		for _, it := range en.Items {
			if it.Kind == ledger.KindSession {
				held[it.ID] += it.CostMiB
			}
		}
	}
	out := sessionList{OK: true, Sessions: []sessionRow{}}
	now := time.Now()
	for _, rec := range recs {
		row := sessionRow{Record: rec, DiskBytes: st.DiskBytes(rec.ID),
			AgeS: int64(now.Sub(rec.Created).Seconds()), IdleS: int64(now.Sub(cmp.Or(rec.LastUsed, rec.Created)).Seconds())}
		if rec.State == session.StateRunning {
			// A session started before the ledger counts as the ledger
			// would count it.
			row.MemoryMiB = cmp.Or(held[rec.ID],
				sandbox.Request{MemMiB: rec.Spec.MemMiB}.WithDefaults().MemMiB+admission.VMMOverheadMiB(e.settings.Accel))
			out.Total.Running++
		}
		out.Total.MemoryMiB += row.MemoryMiB
		out.Total.DiskBytes += row.DiskBytes
		out.Sessions = append(out.Sessions, row)
	}
	return out
}
