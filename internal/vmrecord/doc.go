// Package vmrecord is a run's directory under the state root's vms/: its
// record (record.json: who owns the run, which VMM process carries it,
// how it ended), its console log, and what the front ends read back from
// the directories: the listing, the pruning of old records, and the
// allowlist a filtered run's egress record suggests. The core
// (internal/sandbox) makes the directories and decides what a GC kills.
package vmrecord
