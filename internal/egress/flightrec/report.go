package flightrec

import "isopod/internal/egress"

// InlineCap is how many entries each list of a [Report] carries; the file
// has them all.
const InlineCap = 64

// Report is a filtered run's egress block: the rules, the first InlineCap
// allowed and refused flows, the first InlineCap distinct names the guest
// asked the gateway's resolver for, and where the whole record is.
type Report struct {
	Mode          string   `json:"mode"`
	AllowedRules  []string `json:"allowed_rules"`
	Allowed       []Event  `json:"allowed"`
	Denied        []Event  `json:"denied"`
	DNSQueries    []string `json:"dns_queries"` // distinct, in first-asked order
	TotalEvents   int      `json:"total_events"`
	Truncated     bool     `json:"truncated"`
	EgressLogPath string   `json:"egress_log_path"`
}

// reportBuilder keeps the report of a filtered Log. Its owner serialises
// calls.
type reportBuilder struct {
	rep     Report
	queried map[string]bool // the names in rep.DNSQueries
}

func newReportBuilder(rules []string, path string) *reportBuilder {
	if rules == nil {
		rules = []string{}
	}
	return &reportBuilder{queried: make(map[string]bool), rep: Report{Mode: ModeFiltered, AllowedRules: rules,
		Allowed: []Event{}, Denied: []Event{}, DNSQueries: []string{}, EgressLogPath: path}}
}

// add counts a sanitised event and lists it where it belongs: refused flows
// in denied, allowed ones other than DNS in allowed, the name of every DNS
// query (once) in dns_queries. A query with no readable name
// (egress.MalformedHost) names nothing and is only in denied.
func (b *reportBuilder) add(ev Event) {
	b.rep.TotalEvents++
	if ev.Proto == egress.ProtoDNS && ev.Host != "" && ev.Host != egress.MalformedHost && !b.queried[ev.Host] {
		if len(b.rep.DNSQueries) < InlineCap {
			b.queried[ev.Host] = true
			b.rep.DNSQueries = append(b.rep.DNSQueries, ev.Host)
		} else {
			b.rep.Truncated = true
		}
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
	r.DNSQueries = append([]string{}, r.DNSQueries...)
	r.Truncated = r.Truncated || dropped
	return r
}
