// Package layering holds no code: its tests enforce the import rules of
// isopod's packages (docs/architecture.md, "Packages and import rules").
package layering
