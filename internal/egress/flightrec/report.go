package flightrec

import "isopod/internal/egress"

// InlineCap is how many entries each list of a [Report] carries; the file
// has them all.
const InlineCap = 64

// Report is a filtered run's egress block: the rules, the first InlineCap
// allowed and refused flows and DNS queries, and where the whole record
// is.
type Report struct {
	Mode          string   `json:"mode"`
	AllowedRules  []string `json:"allowed_rules"`
	Allowed       []Event  `json:"allowed"`
	Denied        []Event  `json:"denied"`
	DNSQueries    []Event  `json:"dns_queries"`
	TotalEvents   int      `json:"total_events"`
	Truncated     bool     `json:"truncated"`
	EgressLogPath string   `json:"egress_log_path"`
}

// reportBuilder keeps the report of a filtered Log. Its owner serialises
// calls.
type reportBuilder struct {
	rep Report
}

func newReportBuilder(rules []string, path string) *reportBuilder {
	if rules == nil {
		rules = []string{}
	}
	return &reportBuilder{rep: Report{Mode: ModeFiltered, AllowedRules: rules, Allowed: []Event{}, Denied: []Event{},
		DNSQueries: []Event{}, EgressLogPath: path}}
}

// add counts a sanitised event and lists it where it belongs: refused flows
// in denied, allowed ones other than DNS in allowed, every DNS query in
// dns_queries.
func (b *reportBuilder) add(ev Event) {
	b.rep.TotalEvents++
	if ev.Proto == egress.ProtoDNS {
		b.inline(&b.rep.DNSQueries, ev)
	}
	switch {
	case !ev.Allowed:
		b.inline(&b.rep.Denied, ev)
	case ev.Proto != egress.ProtoDNS:
		b.inline(&b.rep.Allowed, ev)
	}
}

func (b *reportBuilder) inline(list *[]Event, ev Event) {
	if len(*list) >= InlineCap {
		b.rep.Truncated = true
		return
	}
	*list = append(*list, ev)
}

// report returns a copy; dropped says the file missed events.
func (b *reportBuilder) report(dropped bool) Report {
	r := b.rep
	r.Allowed = append([]Event{}, r.Allowed...)
	r.Denied = append([]Event{}, r.Denied...)
	r.DNSQueries = append([]Event{}, r.DNSQueries...)
	r.Truncated = r.Truncated || dropped
	return r
}
