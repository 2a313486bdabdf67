// Package stages is the stage and base store as the front ends manage it:
// stages listed, described, removed, logged and compared, pushed to and
// pulled from OCI registries, and bases imported, listed, built and
// removed, with the guest kernel fetched. The planner (internal/sandbox)
// opens the store, resolves a run's chain and checks its commit label
// through a Service of its own (Open, Chain, CheckLabelFree) and commits
// itself. A Service reads the settings it is handed and nothing else.
package stages
