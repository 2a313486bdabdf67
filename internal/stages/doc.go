// Package stages is the stage and base store as the front ends manage it:
// stages listed, described, removed, logged and compared, pushed to and
// pulled from OCI registries, and bases imported, listed, built and
// removed, with the guest kernel fetched. Runs (internal/sandbox) resolve
// and commit stages themselves; everything else a front end does to the
// store is here. A Service reads the settings the front end hands it and
// nothing else.
package stages
