// Package sandbox is isopod's one core: both the CLI and the MCP server call
// it. A [Service] runs one command in a fresh microVM per call, keeps stages,
// images and VM records under the state root, and returns a [Report].
package sandbox
