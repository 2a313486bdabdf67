// Package egress is isopod's egress policy: the rules that decide where a
// guest's traffic may go. It is pure decision code: it opens no socket,
// parses no wire protocol and reads no host configuration, so the same rules
// serve every network path (the userspace stack, the proxies) and can be
// tested as plain functions.
//
// What it holds:
//   - [ParseRules] is the one parser of a run's network switches: it turns
//     [Switches] (text, as the front ends take them) into [Rules], the
//     parsed policy that everything after request validation takes as is.
//   - [Category] classifies a destination address (public, private,
//     loopback, ...).
//   - [Policy] is the decision point consulted for every new TCP
//     connection, UDP flow and DNS query. [PublicOnly] is the policy of NAT
//     runs; [Filter] the default-deny policy of filtered runs (built over
//     [Rules]), which is also a [Sniffer] (it judges the names a connection
//     carries) and answers the DNS queries it allows ([Filter.ResolveDNS])
//     and the proxies' requests ([Filter.Judge]).
//   - [Pattern] (an --allow-host rule), [NormalizeHost] and [RecordHost]
//     define which names exist and how a guest-supplied name may appear in
//     a record.
//   - [Suggest] turns what a run tried into the smallest allowlist.
//
// The reasons a verdict carries (the Reason constants) are the documented
// vocabulary of the flight recorder (package flightrec).
package egress
